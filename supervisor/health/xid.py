"""NVIDIA Xid codes: what each one means and what the supervisor suggests doing about it.

Source: NVIDIA's Xid catalog for Ampere and newer GPUs, its "Resolution Bucket (Immediate
Action)" column (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), as
reviewed for issue 39 (2026-12). Each bucket becomes one supervisor action:

* ``RESTART_APP`` (application level: 8, 13, 31, 32, 43, 45, 68, 69, 94): the job's context hit a
  fault, the GPU itself is fine -> ``restart``;
* ``IGNORE`` (informational: 63 a row remapping recorded, 92 a high single-bit ECC rate, 121 a
  corrected C2C link error): the GPU keeps working; a restart would only burn budget -> ``warn``
  (recorded, the job keeps running; the gate's remap/recovery checks still see a reset need);
* ``RESET_GPU`` / ``RESTART_BM`` / ``CONTACT_SUPPORT`` (node level: 46, 48, 61, 62, 64, 74, 79, 95,
  109, 119, 120, 136, 140, 143, 154, 155, 156, 158): the GPU needs a reset, the node a reboot or a
  human -> ``give_up`` with "drain or reset this node": no relaunch onto that GPU.

The driver's GPU recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, r570+; Xid 154 says it
changed) is read by the gate: a reset or reboot required refuses the relaunch whatever the table
says. Overrides come from ``gpu.xid_actions`` (``{"79" = "give_up"}``); unknown codes get
``gpu.xid_default_action``.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Mapping

from ..events import Action

CATALOG = "NVIDIA Xid catalog (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), reviewed 2026-12"
NODE_ADVICE = "drain or reset this node"
APP_ADVICE = "application-level fault; the GPU itself is usable, restarting the job"
INFO_ADVICE = "informational (the catalog's immediate action: ignore); recorded, the job keeps running"


class XidLevel(StrEnum):
    APPLICATION = "application"
    INFO = "info"
    NODE = "node"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class XidInfo:
    code: int
    meaning: str
    level: XidLevel
    action: Action
    advice: str


def _app(code: int, meaning: str) -> XidInfo:
    return XidInfo(code, meaning, XidLevel.APPLICATION, Action.RESTART, APP_ADVICE)


def _info(code: int, meaning: str) -> XidInfo:
    return XidInfo(code, meaning, XidLevel.INFO, Action.WARN, INFO_ADVICE)


def _node(code: int, meaning: str) -> XidInfo:
    return XidInfo(code, meaning, XidLevel.NODE, Action.GIVE_UP, NODE_ADVICE)


XID_TABLE: Mapping[int, XidInfo] = {x.code: x for x in (
    _app(8, "GPU stopped processing (timeout); usually a driver or application error"),
    _app(13, "graphics engine exception (e.g. out-of-range access by the application)"),
    _app(31, "GPU memory page fault (illegal address accessed by the application)"),
    _app(32, "invalid or corrupted push buffer stream"),
    _app(43, "GPU stopped processing: the application's context hit a fault and was reset"),
    _app(45, "preemptive cleanup after a previous error (e.g. the process was killed)"),
    _app(68, "video processor (NVDEC) exception"),
    _app(69, "graphics engine class error"),
    _app(94, "contained ECC error: only the affected application must restart"),
    _info(63, "ECC page retirement / row remapping recorded (applied at the next GPU reset)"),
    _info(92, "high single-bit ECC error rate (corrected)"),
    _info(121, "C2C link error (corrected)"),
    _node(46, "GPU stopped processing: the GPU needs a reset"),
    _node(48, "double-bit ECC error: the GPU needs a reset"),
    _node(61, "internal micro-controller breakpoint/warning"),
    _node(62, "internal micro-controller halt"),
    _node(64, "ECC page retirement / row remapping failed"),
    _node(74, "NVLink error"),
    _node(79, "GPU has fallen off the bus"),
    _node(95, "uncontained ECC error: the GPU needs a reset"),
    _node(109, "context switch timeout: the GPU needs a reset"),
    _node(119, "GSP RPC timeout (GPU firmware not responding)"),
    _node(120, "GSP error (GPU firmware)"),
    _node(136, "the catalog's immediate action: reset the GPU"),
    _node(140, "unrecovered ECC error"),
    _node(143, "the catalog's immediate action: reset the GPU"),
    _node(154, "GPU recovery action changed: a reset or reboot is required"),
    _node(155, "the catalog's immediate action: reset the GPU"),
    _node(156, "the catalog's immediate action: reset the GPU"),
    _node(158, "the catalog's immediate action: reset the GPU"),
)}


def classify_xid(code: int, overrides: Mapping[str, str] | None = None,
                 default_action: str = "restart") -> XidInfo:
    """The meaning of ``code`` and its suggested action, after ``gpu.xid_actions`` overrides."""
    known = XID_TABLE.get(code)
    info = known or XidInfo(code, f"Xid {code} (not in the built-in table; see NVIDIA's Xid catalog)",
                            XidLevel.UNKNOWN, Action(default_action),
                            "unknown Xid; following gpu.xid_default_action")
    override = (overrides or {}).get(str(code))
    if override is not None and Action(override) != info.action:
        advice = NODE_ADVICE if Action(override) == Action.GIVE_UP else f"gpu.xid_actions sets {override}"
        info = XidInfo(code, info.meaning, info.level, Action(override), advice)
    return info
