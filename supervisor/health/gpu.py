"""The GPU boundary: one narrow interface, two implementations.

* :class:`NvmlBackend` talks to the driver through NVIDIA's official bindings (``nvidia-ml-py``,
  import name ``pynvml``). Every call is guarded: a missing library or a failing ``nvmlInit``
  raises :class:`GpuBlindError` (the monitor then says "unavailable", never "healthy"); a device
  that fell off the bus raises :class:`GpuLostError`; a query the device does not support
  returns ``None``.
* :class:`FakeBackend` replays a timeline of ``(t_seconds, change)`` items against an injectable
  clock (memory creep, Xid events, ECC errors, a lost GPU, per-process memory). It is for tests
  only and is never chosen by configuration: :func:`make_backend` knows ``nvml`` and ``none``, and
  no environment variable or config value switches a node's GPU health to a fake. Tests construct
  it (or :meth:`FakeBackend.from_file` a JSON timeline) and hand it to the monitor or the gate;
  the end-to-end tests start the real daemon through ``tests/helpers/fake_gpu_daemon.py``, which
  replaces the backend factory in its own process.

Timeline JSON::

    {"devices": 8, "total_gb": 80, "name": "Fake H100",          # or "devices": [{...}, ...]
     "init_error": null,                                          # a string: the backend is blind
     "timeline": [[0, {"memory": {"device": 0, "used_frac": 0.5}}],
                  [2, {"memory_ramp": {"device": 0, "to_frac": 0.995, "over_s": 5}}],
                  [3, {"xid": {"device": 1, "code": 79}}],
                  [4, {"ecc_dbe": {"device": 2}}],
                  [5, {"lost": {"device": 3}}],
                  [6, {"processes": {"device": 0, "pids": {"job": 1073741824}}}],
                  [7, {"pending": {"device": 4, "retired_pages": true, "remap": false}}]]}

``t`` counts from :meth:`FakeBackend.init`. In ``processes`` the pid ``"job"`` stands for the pid
given to :meth:`FakeBackend.bind_job` (the monitor binds the job's pid when an attempt starts).
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

import structlog

log = structlog.get_logger("supervisor.health")

GiB = 1024**3


class GpuBlindError(RuntimeError):
    """Raised by ``init`` (or any call after NVML broke) when GPU health cannot be observed.

    NVML missing, the driver not loaded, no permission. The monitor turns it into one ``gpu_blind``
    log event and reports ``available: false``; the pre-launch gate says "unavailable" (a failure
    only with ``gpu.require = true``). Fix the driver / container runtime to see the GPUs again.
    """


class GpuLostError(RuntimeError):
    """Raised by a per-device query when NVML answers NVML_ERROR_GPU_IS_LOST (fell off the bus).

    The node needs a reset or a drain; the monitor reports a ``gpu_fault`` once per device.
    """

    def __init__(self, index: int, message: str = "") -> None:
        super().__init__(message or f"GPU {index} is lost (fell off the bus)")
        self.index = index


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


class GpuBackend(Protocol):
    """What the monitor and the gate need from the GPU driver. Per-device calls take the index.

    ``init`` raises :class:`GpuBlindError`; per-device calls raise :class:`GpuLostError` for a lost
    GPU and return ``None`` for an unsupported query. ``wait_events`` blocks up to ``timeout_s``
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
    def wait_events(self, timeout_s: float) -> Sequence[GpuEvent]: ...


# --------------------------------------------------------------------------------------------- NVML


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
            procs = self._call(index, lambda g=getter: g(h)) or []
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
                        self._call(i, lambda i=i: nv.nvmlDeviceRegisterEvents(self._handle(i), mask, es))
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


# --------------------------------------------------------------------------------------------- fake


@dataclass
class _FakeDevice:
    info: DeviceInfo
    total: int
    used: float = 0.0
    ramp: tuple[float, float, float, float] | None = None  # (t0, used0, t1, used1)
    procs: dict[str, int] = field(default_factory=dict)
    lost: bool = False
    ecc_uncorrected: int = 0
    pending: PendingRepair = field(default_factory=PendingRepair)
    utilization: int = 0
    temperature: int = 40


class FakeBackend:
    """A scripted GPU node. ``timeline`` items are ``(t_seconds, change)``; see the module doc.

    ``clock`` (default ``time.monotonic``) is injectable so a test can move time by hand;
    ``t`` counts from :meth:`init`. Changes apply lazily when any query looks at the clock.
    """

    def __init__(self, devices: int | Sequence[Mapping[str, Any]] = 1, *, total_gb: float = 80.0,
                 name: str = "Fake GPU", timeline: Iterable[tuple[float, Mapping[str, Any]]] = (),
                 clock: Callable[[], float] = time.monotonic, init_error: str | None = None,
                 driver: str = "999.99.99-fake", cuda: str = "12.9") -> None:
        specs: list[Mapping[str, Any]] = (
            [{} for _ in range(devices)] if isinstance(devices, int) else list(devices))
        self._devices = [
            _FakeDevice(DeviceInfo(i, str(s.get("name", name)), str(s.get("uuid", f"GPU-fake-{i:04d}")),
                                   str(s.get("pci_bus_id", f"00000000:{i + 1:02X}:00.0"))),
                        int(float(s.get("total_gb", total_gb)) * GiB))
            for i, s in enumerate(specs)]
        self._timeline = sorted(((float(t), dict(c)) for t, c in timeline), key=lambda tc: tc[0])
        self._next = 0
        self._clock = clock
        self._t0: float | None = None
        self._init_error = init_error
        self._driver, self._cuda = driver, cuda
        self._events: list[GpuEvent] = []
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._job_pid: int | None = None
        self.calls = 0  # queries answered: lets a benchmark tell our cost from the fake's

    @classmethod
    def from_file(cls, path: str | Path, clock: Callable[[], float] = time.monotonic) -> FakeBackend:
        data = json.loads(Path(path).read_text())
        return cls(data.get("devices", 1), total_gb=float(data.get("total_gb", 80.0)),
                   name=str(data.get("name", "Fake GPU")),
                   timeline=[(t, c) for t, c in data.get("timeline", [])], clock=clock,
                   init_error=data.get("init_error"))

    # --- driving the fake
    def bind_job(self, pid: int | None) -> None:
        """The pid that ``"job"`` in a ``processes`` change stands for."""
        self._job_pid = pid

    def add(self, t: float, change: Mapping[str, Any]) -> None:
        with self._lock:
            self._timeline.append((float(t), dict(change)))
            self._timeline[self._next:] = sorted(self._timeline[self._next:], key=lambda tc: tc[0])

    def elapsed(self) -> float:
        return 0.0 if self._t0 is None else self._clock() - self._t0

    def _advance(self) -> float:
        with self._lock:
            t = self.elapsed()
            while self._next < len(self._timeline) and self._timeline[self._next][0] <= t:
                at, change = self._timeline[self._next]
                self._next += 1
                self._apply(at, change)
            return t

    def _apply(self, at: float, change: Mapping[str, Any]) -> None:
        for kind, arg in change.items():
            a: Mapping[str, Any] = arg if isinstance(arg, Mapping) else {}
            dev = self._devices[int(a.get("device", 0))] if self._devices else None
            if kind == "memory" and dev:
                dev.ramp = None
                dev.used = float(a["used_frac"]) * dev.total if "used_frac" in a else float(a["used_bytes"])
            elif kind == "memory_ramp" and dev:
                start = self._used_at(dev, at)
                end = float(a["to_frac"]) * dev.total if "to_frac" in a else float(a["to_bytes"])
                dev.used, dev.ramp = start, (at, start, at + float(a.get("over_s", 1.0)), end)
            elif kind == "xid" and dev:
                self._events.append(GpuEvent(GpuEventKind.XID, dev.info.index, int(a["code"])))
            elif kind == "ecc_dbe" and dev:
                dev.ecc_uncorrected += int(a.get("count", 1))
                self._events.append(GpuEvent(GpuEventKind.ECC_DBE, dev.info.index))
            elif kind == "lost" and dev:
                dev.lost = True
            elif kind == "processes" and dev:
                dev.procs = {str(p): int(b) for p, b in dict(a.get("pids", {})).items()}
            elif kind == "pending" and dev:
                dev.pending = PendingRepair(a.get("retired_pages"), a.get("remap"), a.get("remap_failure"))
            elif kind == "utilization" and dev:
                dev.utilization = int(a.get("percent", 0))
            elif kind == "blind":
                self._init_error = str(arg)
            else:
                raise ValueError(f"unknown fake GPU change {kind!r} (or no such device) at t={at}")
        self._wake.set()

    @staticmethod
    def _used_at(dev: _FakeDevice, t: float) -> float:
        if dev.ramp is None:
            return dev.used
        t0, u0, t1, u1 = dev.ramp
        if t >= t1:
            return u1
        return u0 + (u1 - u0) * max(0.0, t - t0) / (t1 - t0) if t1 > t0 else u1

    def _dev(self, index: int) -> tuple[_FakeDevice, float]:
        t = self._advance()
        self.calls += 1
        if self._init_error is not None:
            raise GpuBlindError(f"NVML stopped working: {self._init_error}")
        dev = self._devices[index]
        if dev.lost:
            raise GpuLostError(index)
        return dev, t

    # --- the backend interface
    def init(self) -> None:
        if self._init_error is not None:
            raise GpuBlindError(f"nvmlInit failed: {self._init_error}")
        if self._t0 is None:
            self._t0 = self._clock()

    def shutdown(self) -> None:
        self._wake.set()

    def device_count(self) -> int:
        self._advance()
        return len(self._devices)

    def device_info(self, index: int) -> DeviceInfo:
        return self._dev(index)[0].info

    def driver_version(self) -> str | None:
        return self._driver

    def cuda_driver_version(self) -> str | None:
        return self._cuda

    def memory(self, index: int) -> MemoryInfo:
        dev, t = self._dev(index)
        return MemoryInfo(int(self._used_at(dev, t)), dev.total)

    def processes(self, index: int) -> Mapping[int, int]:
        dev, _ = self._dev(index)
        out: dict[int, int] = {}
        for p, b in dev.procs.items():
            pid = self._job_pid if p == "job" else int(p)
            if pid is not None:
                out[pid] = b
        return out

    def utilization(self, index: int) -> int | None:
        return self._dev(index)[0].utilization

    def temperature(self, index: int) -> int | None:
        return self._dev(index)[0].temperature

    def throttle_reasons(self, index: int) -> int | None:
        self._dev(index)
        return 0

    def ecc_uncorrected_volatile(self, index: int) -> int | None:
        return self._dev(index)[0].ecc_uncorrected

    def pending_repair(self, index: int) -> PendingRepair:
        return self._dev(index)[0].pending

    def wait_events(self, timeout_s: float) -> Sequence[GpuEvent]:
        deadline = time.monotonic() + timeout_s
        while True:
            self._advance()
            with self._lock:
                if self._events:
                    out, self._events = self._events, []
                    return out
                self._wake.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            # sleep until the next timeline item, the timeout, or shutdown; with an injected clock
            # (not real seconds) look again every 50 ms
            wait = min(left, 0.05)
            if self._clock is time.monotonic:
                with self._lock:
                    due = (self._timeline[self._next][0] - self.elapsed()
                           if self._next < len(self._timeline) else left)
                wait = min(left, max(due, 0.001))
            self._wake.wait(wait)


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
