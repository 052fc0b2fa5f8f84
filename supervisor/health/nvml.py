"""The real GPU backends: :class:`NvmlBackend` through ``pynvml`` (every call guarded, see
:mod:`.gpu`), the ``none`` backend for GPU monitoring switched off, and :func:`make_backend`,
which picks one from ``gpu.backend``."""
from __future__ import annotations

import threading
from typing import Any, Callable, Mapping, Sequence

import structlog

from .gpu import (DeviceInfo, GpuBackend, GpuBlindError, GpuEvent, GpuEventKind, GpuLostError, MemoryInfo,
                  PendingRepair)

log = structlog.get_logger("supervisor.health")


def _decode(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlBackend:
    """The real thing, through ``pynvml``. Safe to construct anywhere: nothing loads until init."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handles: dict[int, Any] = {}
        self._event_set: Any = None
        self._lock = threading.Lock()
        self._initialized = False

    def init(self) -> None:
        if self._initialized:
            return
        try:
            import pynvml  # nvidia-ml-py; imported late so a broken install only blinds us
        except Exception as exc:  # noqa: BLE001 - ImportError or a broken module alike
            raise GpuBlindError(f"nvidia-ml-py (pynvml) cannot be imported: {exc}") from exc
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
            raise GpuBlindError(f"nvmlInit failed: {exc}") from exc
        self._nvml = pynvml
        self._initialized = True

    def shutdown(self) -> None:
        with self._lock:
            if not self._initialized:
                return
            if self._event_set is not None:
                self._guard_silent(lambda: self._nvml.nvmlEventSetFree(self._event_set))
                self._event_set = None
            self._guard_silent(self._nvml.nvmlShutdown)
            self._handles.clear()
            self._initialized = False

    # Every NVML call goes through here: lost -> GpuLostError, unsupported -> None, other -> raise.
    def _call(self, index: int | None, fn: Callable[[], Any]) -> Any:
        if not self._initialized:
            raise GpuBlindError("NVML is not initialized")
        nv = self._nvml
        try:
            return fn()
        except nv.NVMLError as exc:
            value = getattr(exc, "value", None)
            if value == nv.NVML_ERROR_GPU_IS_LOST:
                raise GpuLostError(index if index is not None else -1, f"GPU {index} is lost: {exc}") from exc
            if value in (nv.NVML_ERROR_NOT_SUPPORTED, getattr(nv, "NVML_ERROR_NO_PERMISSION", -1),
                         getattr(nv, "NVML_ERROR_FUNCTION_NOT_FOUND", -1)):
                return None
            if value in (nv.NVML_ERROR_UNINITIALIZED, nv.NVML_ERROR_DRIVER_NOT_LOADED,
                         nv.NVML_ERROR_LIBRARY_NOT_FOUND):
                raise GpuBlindError(f"NVML stopped working: {exc}") from exc
            raise

    @staticmethod
    def _guard_silent(fn: Callable[[], Any]) -> None:
        try:
            fn()
        except Exception:  # noqa: BLE001 - best effort during shutdown
            pass

    def _handle(self, index: int) -> Any:
        h = self._handles.get(index)
        if h is None:
            h = self._call(index, lambda: self._nvml.nvmlDeviceGetHandleByIndex(index))
            self._handles[index] = h
        return h

    def device_count(self) -> int:
        return int(self._call(None, self._nvml.nvmlDeviceGetCount))

    def device_info(self, index: int) -> DeviceInfo:
        nv, h = self._nvml, self._handle(index)
        name = self._call(index, lambda: nv.nvmlDeviceGetName(h))
        uuid = self._call(index, lambda: nv.nvmlDeviceGetUUID(h))
        pci = self._call(index, lambda: nv.nvmlDeviceGetPciInfo(h))
        bus = _decode(getattr(pci, "busId", "")) if pci is not None else ""
        return DeviceInfo(index, _decode(name or "?"), _decode(uuid or "?"), bus)

    def driver_version(self) -> str | None:
        v = self._call(None, self._nvml.nvmlSystemGetDriverVersion)
        return _decode(v) if v is not None else None

    def cuda_driver_version(self) -> str | None:
        v = self._call(None, self._nvml.nvmlSystemGetCudaDriverVersion)
        return f"{v // 1000}.{(v % 1000) // 10}" if isinstance(v, int) else None

    def memory(self, index: int) -> MemoryInfo:
        h = self._handle(index)
        m = self._call(index, lambda: self._nvml.nvmlDeviceGetMemoryInfo(h))
        return MemoryInfo(int(m.used), int(m.total))

    def processes(self, index: int) -> Mapping[int, int]:
        nv, h = self._nvml, self._handle(index)
        out: dict[int, int] = {}
        for getter in (nv.nvmlDeviceGetComputeRunningProcesses, nv.nvmlDeviceGetGraphicsRunningProcesses):
            procs = self._call(index, lambda g=getter: g(h)) or []  # type: ignore[misc]
            for p in procs:
                used = getattr(p, "usedGpuMemory", None)
                # NVML reports "not available" (e.g. without permission) as None or a huge sentinel
                if isinstance(used, int) and used < 2**62:
                    out[int(p.pid)] = out.get(int(p.pid), 0) + used
                else:
                    out.setdefault(int(p.pid), 0)
        return out

    def utilization(self, index: int) -> int | None:
        h = self._handle(index)
        u = self._call(index, lambda: self._nvml.nvmlDeviceGetUtilizationRates(h))
        return int(u.gpu) if u is not None else None

    def temperature(self, index: int) -> int | None:
        nv, h = self._nvml, self._handle(index)
        t = self._call(index, lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
        return int(t) if t is not None else None

    def throttle_reasons(self, index: int) -> int | None:
        nv, h = self._nvml, self._handle(index)
        fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        r = self._call(index, lambda: fn(h))
        return int(r) if r is not None else None

    def ecc_uncorrected_volatile(self, index: int) -> int | None:
        nv, h = self._nvml, self._handle(index)
        c = self._call(index, lambda: nv.nvmlDeviceGetTotalEccErrors(
            h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC))
        return int(c) if c is not None else None

    def pending_repair(self, index: int) -> PendingRepair:
        nv, h = self._nvml, self._handle(index)
        pages = self._call(index, lambda: nv.nvmlDeviceGetRetiredPagesPendingStatus(h))
        rows = self._call(index, lambda: nv.nvmlDeviceGetRemappedRows(h))
        remap_pending = bool(rows[2]) if rows is not None else None
        remap_failure = bool(rows[3]) if rows is not None else None
        return PendingRepair(bool(pages) if pages is not None else None, remap_pending, remap_failure)

    def _ensure_event_set(self) -> Any:
        nv = self._nvml
        with self._lock:
            if self._event_set is None:
                es = self._call(None, nv.nvmlEventSetCreate)
                mask = nv.nvmlEventTypeXidCriticalError | nv.nvmlEventTypeDoubleBitEccError
                registered = 0
                for i in range(self.device_count()):
                    try:
                        self._call(i, lambda i=i: nv.nvmlDeviceRegisterEvents(self._handle(i), mask, es))  # type: ignore[misc]
                        registered += 1
                    except Exception as exc:  # noqa: BLE001 - some GPUs refuse events; poll still works
                        log.warning("gpu_events_unsupported", device=i, error=str(exc),
                                    next="Xid events from this GPU are not seen; polling continues")
                log.info("gpu_events_registered", devices=registered)
                self._event_set = es
            return self._event_set

    def wait_events(self, timeout_s: float) -> Sequence[GpuEvent]:
        nv = self._nvml
        es = self._ensure_event_set()
        handle_to_index = {id(h): i for i, h in self._handles.items()}
        try:
            data = nv.nvmlEventSetWait(es, int(timeout_s * 1000))
        except nv.NVMLError as exc:
            if getattr(exc, "value", None) == nv.NVML_ERROR_TIMEOUT:
                return []
            if getattr(exc, "value", None) == nv.NVML_ERROR_GPU_IS_LOST:
                raise GpuLostError(-1, f"a GPU is lost: {exc}") from exc
            raise
        index = self._index_of(data.device, handle_to_index)
        if data.eventType & nv.nvmlEventTypeXidCriticalError:
            return [GpuEvent(GpuEventKind.XID, index, int(data.eventData))]
        if data.eventType & nv.nvmlEventTypeDoubleBitEccError:
            return [GpuEvent(GpuEventKind.ECC_DBE, index)]
        return []

    def _index_of(self, device: Any, cache: Mapping[int, int]) -> int:
        try:
            return int(self._nvml.nvmlDeviceGetIndex(device))
        except Exception:  # noqa: BLE001 - fall back to the handle identity
            return cache.get(id(device), -1)


class NullBackend:
    """``gpu.backend = "none"``: GPU monitoring switched off on purpose (reported as blind)."""

    def init(self) -> None:
        raise GpuBlindError('GPU monitoring is off (gpu.backend = "none")')

    def shutdown(self) -> None:
        return None


def make_backend(spec: str) -> GpuBackend:
    """The backend for ``gpu.backend``: ``nvml`` (real devices) or ``none`` (off). Nothing else,
    and nothing from the environment: the fake is injected by tests, never configured."""
    if spec == "none":
        return NullBackend()  # type: ignore[return-value]
    if spec == "nvml":
        return NvmlBackend()
    raise ValueError(f'gpu.backend: expected "nvml" or "none", got "{spec}"')
