"""NVIDIA Xid codes: what each one means and what the supervisor suggests doing about it.

Source: NVIDIA's "Xid Errors" catalog (docs.nvidia.com/deploy/xid-errors). Two families matter:

* application-level faults (13, 31, 43, ...): the job did something wrong (an illegal address, a
  killed context); the GPU itself is fine, so a restart is worth trying;
* node-level faults (48, 63, 64, 74, 79, 92, 95, 119, 120, ...): the hardware, its memory or its
  firmware is in trouble; restarting onto it only burns the restart budget, so the default is to
  give up with "drain or reset this node".

Overrides come from ``gpu.xid_actions`` (``{"79" = "give_up"}``); unknown codes get
``gpu.xid_default_action``.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Mapping

from ..events import Action

NODE_ADVICE = "drain or reset this node"
APP_ADVICE = "application-level fault; the GPU itself is usable, restarting the job"


class XidLevel(StrEnum):
    APPLICATION = "application"
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
    _app(109, "context switch timeout"),
    _node(48, "double-bit ECC error: the GPU needs a reset"),
    _node(61, "internal micro-controller breakpoint/warning"),
    _node(62, "internal micro-controller halt"),
    _node(63, "ECC page retirement / row remapping recorded: a GPU reset is needed to apply it"),
    _node(64, "ECC page retirement / row remapping failed"),
    _node(74, "NVLink error"),
    _node(79, "GPU has fallen off the bus"),
    _node(92, "high single-bit ECC error rate"),
    _node(95, "uncontained ECC error: the GPU needs a reset"),
    _node(119, "GSP RPC timeout (GPU firmware not responding)"),
    _node(120, "GSP error (GPU firmware)"),
    _node(121, "C2C link error"),
    _node(140, "unrecovered ECC error"),
    _node(154, "GPU recovery action changed: a reset or reboot is required"),
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
