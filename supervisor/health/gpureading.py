"""One poll of the GPUs, as data: what a device reads (:class:`DeviceReading`, and how it shows in
``status``), the job tree whose share of the memory is counted, and the least-squares trend the
memory watermark reports. Used by :class:`~.gpumonitor.GpuMonitor`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import psutil

from .gpu import DeviceInfo, GpuBackend, GpuDeviceError, GpuLostError, MemoryInfo, PendingRepair


def job_tree_pids(pid: int | None) -> frozenset[int]:
    """``pid`` and all its descendants (psutil); just ``pid`` when it cannot be listed.

    NVML reports pids of the host's pid namespace: inside a container without ``--pid=host`` they
    do not match, and the job's share reads 0 (device totals are still right).
    """
    if pid is None:
        return frozenset()
    try:
        proc = psutil.Process(pid)
        return frozenset([pid, *(c.pid for c in proc.children(recursive=True))])
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return frozenset([pid])


def linear_slope(samples: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope (units per second) of (t, value) samples; None with < 2 distinct t."""
    n = len(samples)
    if n < 2:
        return None
    mt = sum(t for t, _ in samples) / n
    mv = sum(v for _, v in samples) / n
    var = sum((t - mt) ** 2 for t, _ in samples)
    if var == 0:
        return None
    return sum((t - mt) * (v - mv) for t, v in samples) / var


@dataclass(frozen=True)
class DeviceReading:
    """One poll of one device; ``lost`` devices carry only their index (and info when known)."""

    index: int
    info: DeviceInfo | None
    memory: MemoryInfo | None = None
    job_bytes: int | None = None
    processes: Mapping[int, int] = field(default_factory=dict)
    utilization: int | None = None
    temperature: int | None = None
    throttle_reasons: int | None = None
    ecc_uncorrected: int | None = None
    pending: PendingRepair = field(default_factory=PendingRepair)
    lost: bool = False
    unknown: str | None = None  # why NVML could not read this device (GpuDeviceError: kind and message)
    unknown_kind: str | None = None

    def to_status(self, faults: Sequence[str]) -> dict[str, object]:
        info = self.info
        mem = self.memory
        return {
            "index": self.index,
            "name": info.name if info else None,
            "uuid": info.uuid if info else None,
            "pci_bus_id": info.pci_bus_id if info else None,
            "memory_used_bytes": mem.used if mem else None,
            "memory_total_bytes": mem.total if mem else None,
            "memory_fraction": round(mem.fraction, 4) if mem else None,
            "job_memory_bytes": self.job_bytes,
            "utilization_percent": self.utilization,
            "temperature_c": self.temperature,
            "throttle_reasons": self.throttle_reasons,
            "ecc_uncorrected_volatile": self.ecc_uncorrected,
            "reset_pending": self.pending.needs_reset,
            "lost": self.lost,
            "unknown": self.unknown,
            "faults": list(faults),
        }


def device_memory(backend: GpuBackend, index: int, slices: Sequence[str] = ()) -> MemoryInfo:
    """GPU ``index``'s memory, or the sum of the job's MIG devices ``slices`` on it (a job given a
    slice is judged by its slice, not by its neighbours' use of the GPU)."""
    if not slices:
        return backend.memory(index)
    parts = [backend.mig_memory(index, uuid) for uuid in slices]
    return MemoryInfo(sum(p.used for p in parts), sum(p.total for p in parts))


def read_device(backend: GpuBackend, index: int, job_pids: frozenset[int] = frozenset(),
                info: DeviceInfo | None = None, slices: Sequence[str] = ()) -> DeviceReading:
    """Query one device; a lost GPU yields ``lost=True`` instead of raising."""
    try:
        info = info or backend.device_info(index)
        mem = device_memory(backend, index, slices)
        procs = backend.processes(index)
        job = sum(b for p, b in procs.items() if p in job_pids) if job_pids else None
        return DeviceReading(index, info, mem, job, procs, backend.utilization(index),
                             backend.temperature(index), backend.throttle_reasons(index),
                             backend.ecc_uncorrected_volatile(index), backend.pending_repair(index))
    except GpuLostError:
        return DeviceReading(index, info, lost=True)
    except GpuDeviceError as exc:  # this device alone: shown as unknown, the others are still read
        return DeviceReading(index, info, unknown=str(exc), unknown_kind=exc.kind)
