"""GPU and host health: NVML monitor, host memory/disk/storage checks, the pre-launch gate.

Entry points (see each module's doc):

* :func:`make_backend` (``gpu.backend``: nvml | none; the scripted :class:`FakeBackend` is for tests,
  injected by them, never chosen by configuration or the environment)
* :class:`GpuMonitor` (events.Monitor "gpu"): gpu_memory / gpu_fault detections, ``gpus()`` for
  ``status --json``, ``snapshot()`` for the ledger; blind -> ``available: false``, never healthy
* :class:`HostMonitor` (events.Monitor "host"): disk_low (space or a failed storage probe)
* :class:`LaunchGate` / :func:`run_gate`: the verdict before every launch; not passed -> give up
* :func:`probe_storage`: write, fsync, read back, remove; the mount still the one seen at start

The daemon never imports torch; neither does this package (``gpucheck`` runs torch in a child).
"""
from typing import TYPE_CHECKING

from ..lazyexports import lazy_exports

if TYPE_CHECKING:  # the names for the type checker; at run time each is imported on first use
    from .config import GpuConfig, HostConfig
    from .gate import GateVerdict, LaunchGate, run_gate
    from .gpu import GpuBackend, GpuBlindError, GpuLostError
    from .gpufake import FakeBackend
    from .gpumonitor import GpuMonitor
    from .host import HostMonitor, ProbeResult, StorageBaseline, probe_storage
    from .nvml import NvmlBackend, make_backend
    from .xid import XID_TABLE, classify_xid

_WHERE = {
    "GpuConfig": "config", "HostConfig": "config", "GateVerdict": "gate", "LaunchGate": "gate",
    "run_gate": "gate", "GpuBackend": "gpu", "GpuBlindError": "gpu", "GpuLostError": "gpu",
    "FakeBackend": "gpufake", "GpuMonitor": "gpumonitor", "HostMonitor": "host", "ProbeResult": "host",
    "StorageBaseline": "host", "probe_storage": "host", "NvmlBackend": "nvml", "make_backend": "nvml",
    "XID_TABLE": "xid", "classify_xid": "xid",
}
__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())

__all__ = [
    "FakeBackend", "GateVerdict", "GpuBackend", "GpuBlindError", "GpuConfig",
    "GpuLostError", "GpuMonitor", "HostConfig", "HostMonitor", "LaunchGate", "NvmlBackend",
    "ProbeResult", "StorageBaseline", "XID_TABLE", "classify_xid", "make_backend", "probe_storage",
    "run_gate",
]
