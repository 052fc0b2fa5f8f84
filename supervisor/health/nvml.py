"""The real GPU backends: :class:`NvmlBackend` through ``pynvml`` (every call guarded, see
:mod:`.gpu`), the ``none`` backend for GPU monitoring switched off, and :func:`make_backend`,
which picks one from ``gpu.backend``."""
from __future__ import annotations

import threading
from functools import partial
from typing import Any, Callable, Mapping, Sequence

import structlog

from .gpu import (DeviceInfo, GpuBackend, GpuBlindError, GpuDeviceError, GpuEvent, GpuEventKind, GpuLostError,
                  MemoryInfo, MigInfo, PendingRepair)

log = structlog.get_logger("supervisor.health")


def _decode(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlBackend:
    """The real thing, through ``pynvml``. Safe to construct anywhere: nothing loads until init."""

    def __init__(self, nvml: Any = None) -> None:
        # ``nvml``: the pynvml module to use; tests hand in the real module with its C library
        # replaced (tests/helpers/nvml_clib.py), so this code runs as it does on a GPU node.
        self._module = nvml
        self._nvml: Any = None
        self._handles: dict[int, Any] = {}
        self._migs: dict[int, list[Any]] = {}
        self.registered: dict[int, int] = {}  # device -> the event mask really registered
        self._event_set: Any = None
        self._lock = threading.Lock()
        self._initialized = False

    def init(self) -> None:
        if self._initialized:
            return
        try:
            import pynvml  # nvidia-ml-py; imported late so a broken install only blinds us
        except Exception as exc:  # ImportError or a broken module alike
            raise GpuBlindError(f"nvidia-ml-py (pynvml) cannot be imported: {exc}") from exc
        pynvml = self._module or pynvml
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
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
            self._migs.clear()
            self._initialized = False

    # Every NVML call goes through here: lost -> GpuLostError; NVML broken -> GpuBlindError; refused or
    # unsupported -> None for an optional query, GpuDeviceError (that device alone) for a needed one
    # (``need``: the handle, the memory) and for any other error of a device's query (UNKNOWN...).
    def _call(self, index: int | None, fn: Callable[[], Any], need: bool = False) -> Any:
        if not self._initialized:
            raise GpuBlindError("NVML is not initialized")
        nv = self._nvml
        try:
            return fn()
        except nv.NVMLError as exc:
            value = getattr(exc, "value", None)
            if value == nv.NVML_ERROR_GPU_IS_LOST:
                raise GpuLostError(index if index is not None else -1, f"GPU {index} is lost: {exc}") from exc
            if value in (nv.NVML_ERROR_UNINITIALIZED, nv.NVML_ERROR_DRIVER_NOT_LOADED,
                         nv.NVML_ERROR_LIBRARY_NOT_FOUND):
                raise GpuBlindError(f"NVML stopped working: {exc}") from exc
            kind = {nv.NVML_ERROR_NO_PERMISSION: "no_permission", nv.NVML_ERROR_NOT_SUPPORTED: "not_supported",
                    nv.NVML_ERROR_FUNCTION_NOT_FOUND: "not_supported"}.get(value, "unknown")
            if kind != "unknown" and not need:
                return None
            if index is None:
                raise
            raise GpuDeviceError(index, kind, f"GPU {index}: NVML answered {exc} ({kind})") from exc

    @staticmethod
    def _guard_silent(fn: Callable[[], Any]) -> None:
        try:
            fn()
        except Exception:  # best effort during shutdown
            pass

    def _handle(self, index: int) -> Any:
        h = self._handles.get(index)
        if h is None:
            # NO_PERMISSION here: a device cgroup (container) denies this GPU; the others go on
            h = self._call(index, lambda: self._nvml.nvmlDeviceGetHandleByIndex(index), need=True)
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

    def _mig_handles(self, index: int) -> list[Any]:
        """The MIG devices of GPU ``index`` this process may open (none: MIG off or not supported).
        On a MIG parent, memory and processes are per MIG device; in a container the parent's own
        memory query answers NO_PERMISSION."""
        if index in self._migs:
            return self._migs[index]
        nv, h = self._nvml, self._handle(index)
        out: list[Any] = []
        mode = self._call(index, lambda: nv.nvmlDeviceGetMigMode(h))
        if mode is not None and mode[0] == nv.NVML_DEVICE_MIG_ENABLE:
            for i in range(int(self._call(index, lambda: nv.nvmlDeviceGetMaxMigDeviceCount(h)) or 0)):
                try:
                    out.append(nv.nvmlDeviceGetMigDeviceHandleByIndex(h, i))
                except nv.NVMLError:  # NOT_FOUND: an empty slot; NO_PERMISSION: another tenant's
                    continue
        self._migs[index] = out
        return out

    def mig_devices(self, index: int) -> Sequence[MigInfo]:
        nv, out = self._nvml, []
        for g in self._mig_handles(index):
            uuid = self._call(index, partial(nv.nvmlDeviceGetUUID, g))
            gi = self._call(index, partial(nv.nvmlDeviceGetGpuInstanceId, g))
            ci = self._call(index, partial(nv.nvmlDeviceGetComputeInstanceId, g))
            if uuid is not None and gi is not None and ci is not None:
                out.append(MigInfo(_decode(uuid), int(gi), int(ci)))
        return out

    def mig_memory(self, index: int, uuid: str) -> MemoryInfo:
        """The memory of GPU ``index``'s MIG device ``uuid`` (the slice the job was given)."""
        nv = self._nvml
        for g in self._mig_handles(index):
            if _decode(self._call(index, partial(nv.nvmlDeviceGetUUID, g)) or "") == uuid:
                m = self._call(index, partial(nv.nvmlDeviceGetMemoryInfo, g), need=True)
                return MemoryInfo(int(m.used), int(m.total))
        raise GpuDeviceError(index, "not_found", f"GPU {index} has no MIG device {uuid} this process may open")

    def memory(self, index: int) -> MemoryInfo:
        h = self._handle(index)
        try:
            m = self._call(index, lambda: self._nvml.nvmlDeviceGetMemoryInfo(h), need=True)
        except GpuDeviceError as exc:
            migs = self._mig_handles(index) if exc.kind != "unknown" else []
            if not migs:
                raise
            parts = [self._call(index, partial(self._nvml.nvmlDeviceGetMemoryInfo, g)) for g in migs]
            seen = [p for p in parts if p is not None]
            if not seen:
                raise
            return MemoryInfo(sum(int(p.used) for p in seen), sum(int(p.total) for p in seen))
        return MemoryInfo(int(m.used), int(m.total))

    def processes(self, index: int) -> Mapping[int, int]:
        nv = self._nvml
        out: dict[int, int] = {}
        calls = [(g, h) for h in (self._handle(index), *self._mig_handles(index))
                 for g in (nv.nvmlDeviceGetComputeRunningProcesses, nv.nvmlDeviceGetGraphicsRunningProcesses)]
        for getter, h in calls:
            procs = self._call(index, lambda g=getter, h=h: g(h)) or []  # type: ignore[misc]
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

    def recovery_action(self, index: int) -> int | None:
        nv, h = self._nvml, self._handle(index)
        field = getattr(nv, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
        if field is None:
            return None
        values = self._call(index, lambda: nv.nvmlDeviceGetFieldValues(h, [field]))
        if values is None or values[0].nvmlReturn != nv.NVML_SUCCESS:
            return None  # a driver before r570 has no such field
        return int(values[0].value.uiVal)

    def _ensure_event_set(self) -> Any:
        nv = self._nvml
        with self._lock:
            if self._event_set is None:
                es = self._call(None, nv.nvmlEventSetCreate)
                wanted = nv.nvmlEventTypeXidCriticalError | nv.nvmlEventTypeDoubleBitEccError
                self.registered = {}
                for i in range(self.device_count()):
                    # Only the types the device supports: NVML registers none of a mask holding one
                    # it does not (a GPU without ECC events would then send no Xid either).
                    try:
                        h = self._handle(i)
                        supported = self._call(i, partial(nv.nvmlDeviceGetSupportedEventTypes, h))
                        mask = wanted & (supported if supported is not None else wanted)
                        if mask:
                            self._call(i, partial(nv.nvmlDeviceRegisterEvents, h, mask, es), need=True)
                        self.registered[i] = mask
                    except Exception as exc:  # some GPUs refuse events; poll still works
                        self.registered[i] = 0
                        log.warning("gpu_events_unsupported", device=i, error=str(exc),
                                    next="Xid and ECC events from this GPU are not seen; polling continues")
                said = {i: [n for n, bit in (("xid", nv.nvmlEventTypeXidCriticalError),
                                              ("ecc_double_bit", nv.nvmlEventTypeDoubleBitEccError)) if m & bit]
                        for i, m in self.registered.items()}
                log.info("gpu_events_registered", devices=sum(1 for m in said.values() if m),
                         types={str(i): t for i, t in said.items()},
                         next="a GPU without xid here is watched by polling only (ECC counter, lost)")
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
        # 0xFFFFFFFF: the event is the whole GPU's, not one MIG slice's
        gi = int(data.gpuInstanceId) if int(data.gpuInstanceId) != 0xFFFFFFFF else None
        ci = int(data.computeInstanceId) if int(data.computeInstanceId) != 0xFFFFFFFF else None
        if data.eventType & nv.nvmlEventTypeXidCriticalError:
            return [GpuEvent(GpuEventKind.XID, index, int(data.eventData), gpu_instance=gi, compute_instance=ci)]
        if data.eventType & nv.nvmlEventTypeDoubleBitEccError:
            return [GpuEvent(GpuEventKind.ECC_DBE, index, gpu_instance=gi, compute_instance=ci)]
        return []

    def _index_of(self, device: Any, cache: Mapping[int, int]) -> int:
        try:
            return int(self._nvml.nvmlDeviceGetIndex(device))
        except Exception:  # fall back to the handle identity
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
