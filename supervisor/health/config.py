"""Config sections [gpu] and [host]: the NVML monitor, the pre-launch gate, host memory and disk."""
from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Mapping

from ..fieldmeta import meta
from ..core.causes import Action

_ACTIONS = tuple(a.value for a in Action)  # the built-in actions, named once in core/causes.py


def _check_backend(value: str) -> str | None:
    if value in ("nvml", "none"):
        return None
    return f'expected "nvml" or "none", got "{value}"'


def _check_xid_actions(value: Mapping[str, str]) -> str | None:
    for code, action in value.items():
        if not code.isdigit():
            return f'expected Xid codes as keys (e.g. "79"), got "{code}"'
        if action not in _ACTIONS:
            return f'gpu.xid_actions.{code}: expected one of {", ".join(_ACTIONS)}, got "{action}"'
    return None


@dataclass(frozen=True)
class GpuConfig:
    backend: str = field(default="nvml", metadata=meta(
        'where GPU health comes from: "nvml" (real devices) or "none" (off)',
        check=_check_backend))
    poll_s: float = field(default=1.0, metadata=meta(
        "seconds between two NVML polls of every device", min=0.05))
    memory_watermark: float = field(default=0.97, metadata=meta(
        "fraction of a device's memory above which it counts as nearly full", min=0.0, max=1.0,
        min_exclusive=True))
    memory_polls: int = field(default=5, metadata=meta(
        "consecutive polls above the watermark before gpu_memory is raised", min=1))
    events: bool = field(default=True, metadata=meta(
        "listen for Xid and double-bit ECC events from NVML on a thread of its own"))
    xid_actions: Mapping[str, str] = field(default_factory=lambda: types.MappingProxyType({}), metadata=meta(
        'per-Xid suggested action overriding the built-in table, e.g. { "79" = "give_up", "13" = "restart" }',
        check=_check_xid_actions))
    xid_default_action: str = field(default="restart", metadata=meta(
        "suggested action for an Xid code that is not in the table", choices=_ACTIONS))
    ecc_action: str = field(default="give_up", metadata=meta(
        "suggested action for a double-bit (uncorrectable) ECC error: the GPU needs a reset",
        choices=_ACTIONS))
    lost_action: str = field(default="give_up", metadata=meta(
        "suggested action when a GPU is lost (fell off the bus): drain or reset the node",
        choices=_ACTIONS))
    devices: tuple[str, ...] = field(default=(), metadata=meta(
        "the job's GPUs: UUIDs (GPU-..., MIG-...) or NVML indices; empty: from the job's CUDA_VISIBLE_DEVICES, "
        "else NVIDIA_VISIBLE_DEVICES, else every GPU. The gate, the monitor and the events look at these only"))
    expected_devices: int | None = field(default=None, metadata=meta(
        "GPUs that must be present before each launch; omitted: as many as seen at the first start",
        min=0))
    release_timeout_s: float = field(default=60.0, metadata=meta(
        "how long the pre-launch gate waits for the previous attempt's GPU memory to be released",
        min=0))
    release_threshold: float = field(default=0.05, metadata=meta(
        "a device counts as released when its used memory is below this fraction of the total",
        min=0.0, max=1.0))
    require: bool = field(default=False, metadata=meta(
        "true: a blind GPU monitor (NVML missing or failing) fails the pre-launch gate; "
        "false: launch with a warning"))


@dataclass(frozen=True)
class HostConfig:
    poll_s: float = field(default=5.0, metadata=meta(
        "seconds between two host checks (memory, swap, disk space)", min=0.05))
    disk_min_free_gb: float = field(default=5.0, metadata=meta(
        "disk_low when the checkpoint or state dir has less free space than this (GB)", min=0))
    disk_ckpt_multiple: float = field(default=2.0, metadata=meta(
        "disk_low when free space on the checkpoint dir is below this multiple of the last "
        "checkpoint's size (0 turns this off)", min=0))
    storage_probe: bool = field(default=True, metadata=meta(
        "probe the checkpoint dir (write, fsync, read back, remove; mount still present) "
        "before each launch and every probe_interval_s"))
    probe_interval_s: float = field(default=300.0, metadata=meta(
        "seconds between two storage probes while the job runs (0: only before a launch)", min=0))
    memory_warn_fraction: float = field(default=0.05, metadata=meta(
        "log host_memory_low when available host memory falls below this fraction of the total",
        min=0.0, max=1.0))
