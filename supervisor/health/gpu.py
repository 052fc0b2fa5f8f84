"""The GPU boundary: one narrow interface (:class:`GpuBackend`, the errors and readings it
deals in), two implementations.

* :class:`~.nvml.NvmlBackend` talks to the driver through NVIDIA's official bindings
  (``nvidia-ml-py``, import name ``pynvml``). Every call is guarded: a missing library or a
  failing ``nvmlInit`` raises :class:`GpuBlindError` (the monitor then says "unavailable", never
  "healthy"); a device that fell off the bus raises :class:`GpuLostError`; a query the device
  does not support returns ``None``. :func:`~.nvml.make_backend` picks it (or the ``none``
  backend) from ``gpu.backend``.
* :class:`~.gpufake.FakeBackend` replays a timeline of ``(t_seconds, change)`` items against an
  injectable clock, for tests only; it is never chosen by configuration or the environment.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Mapping, Protocol, Sequence

from ..errors import SupervisorError

GiB = 1024**3


class GpuBlindError(SupervisorError, RuntimeError):
    """Raised by ``init`` (or any call after NVML broke) when GPU health cannot be observed.

    NVML missing, the driver not loaded, no permission. The monitor turns it into one ``gpu_blind``
    log event and reports ``available: false``; the pre-launch gate says "unavailable" (a failure
    only with ``gpu.require = true``). Fix the driver / container runtime to see the GPUs again.
    """

    code = "gpu_blind"


class GpuLostError(SupervisorError, RuntimeError):
    """Raised by a per-device query when NVML answers NVML_ERROR_GPU_IS_LOST (fell off the bus).

    The node needs a reset or a drain; the monitor reports a ``gpu_fault`` once per device.
    """

    code = "gpu_lost"

    def __init__(self, index: int, message: str = "") -> None:
        super().__init__(message or f"GPU {index} is lost (fell off the bus)")
        self.index = index


class GpuDeviceError(SupervisorError, RuntimeError):
    """Raised by a per-device query whose answer is needed (the device handle, its memory) when
    NVML refuses it for that device alone: ``kind`` is ``no_permission`` (a device cgroup denies
    the handle, a MIG parent's memory inside a container), ``not_supported``, or ``unknown``
    (NVML_ERROR_UNKNOWN and other errors: a dying GPU often answers so). The other devices are
    still read; the device is shown as unknown (the monitor calls it lost after a few polls of
    ``unknown``), never as fine, and it is never a crash of the gate or the monitor.
    """

    code = "gpu_device_unknown"

    def __init__(self, index: int, kind: str, message: str = "") -> None:
        super().__init__(message or f"GPU {index}: NVML answered {kind}")
        self.index = index
        self.kind = kind


# NVML's GPU recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, driver r570+): what the device
# needs before it can be used again. Those in NEEDS_RESET refuse a relaunch onto the GPU (the gate).
RECOVERY_ACTIONS: Mapping[int, str] = {
    0: "none", 1: "GPU reset", 2: "node reboot", 3: "drain peer-to-peer traffic", 4: "drain and reset",
    5: "recover the IMEX domain", 6: "bus reset", 7: "system reboot"}
NEEDS_RESET = frozenset({1, 2, 4, 6, 7})


class GpuEventKind(StrEnum):
    XID = "xid"
    ECC_DBE = "ecc_double_bit"


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    uuid: str
    pci_bus_id: str


@dataclass(frozen=True)
class MigInfo:
    """A MIG device (slice) of a GPU: its own UUID, its GPU and compute instance ids."""

    uuid: str
    gi: int
    ci: int


@dataclass(frozen=True)
class MemoryInfo:
    used: int
    total: int

    @property
    def fraction(self) -> float:
        return self.used / self.total if self.total else 0.0


@dataclass(frozen=True)
class PendingRepair:
    """Memory repairs that take effect only after a GPU reset (None: the device cannot tell)."""

    retired_pages_pending: bool | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None

    @property
    def needs_reset(self) -> bool:
        return bool(self.retired_pages_pending or self.remap_pending or self.remap_failure)


@dataclass(frozen=True)
class GpuEvent:
    """One NVML event: an Xid (``code``) or a double-bit ECC error on device ``index``."""

    kind: GpuEventKind
    index: int
    code: int | None = None
    at: float = field(default_factory=time.time)
    # the MIG slice the event belongs to (NVML's gpuInstanceId/computeInstanceId; None: the whole GPU)
    gpu_instance: int | None = None
    compute_instance: int | None = None


class GpuBackend(Protocol):
    """What the monitor and the gate need from the GPU driver. Per-device calls take the index.

    ``init`` raises :class:`GpuBlindError`; per-device calls raise :class:`GpuLostError` for a lost
    GPU, :class:`GpuDeviceError` when the device's handle or memory cannot be read, and return
    ``None`` for an unsupported optional query. ``recovery_action`` is the driver's GPU recovery
    action field (r570+; None where the driver has none). ``wait_events`` blocks up to ``timeout_s``
    (call it from a thread of its own) and returns the events seen, possibly none.
    """

    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def device_count(self) -> int: ...
    def device_info(self, index: int) -> DeviceInfo: ...
    def driver_version(self) -> str | None: ...
    def cuda_driver_version(self) -> str | None: ...
    def memory(self, index: int) -> MemoryInfo: ...
    def processes(self, index: int) -> Mapping[int, int]: ...
    def utilization(self, index: int) -> int | None: ...
    def temperature(self, index: int) -> int | None: ...
    def throttle_reasons(self, index: int) -> int | None: ...
    def ecc_uncorrected_volatile(self, index: int) -> int | None: ...
    def pending_repair(self, index: int) -> PendingRepair: ...
    def recovery_action(self, index: int) -> int | None: ...
    def mig_devices(self, index: int) -> Sequence[MigInfo]: ...
    def mig_memory(self, index: int, uuid: str) -> MemoryInfo: ...
    def wait_events(self, timeout_s: float) -> Sequence[GpuEvent]: ...
