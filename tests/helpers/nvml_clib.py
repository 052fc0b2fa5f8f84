"""The NVML C library, simulated: NVIDIA's own ``pynvml`` module runs unchanged with its C calls
answered here, so :class:`supervisor.health.nvml.NvmlBackend` is tested as it runs on a GPU node
(the only fake is at the C boundary, the one we cannot reach without a GPU).

:func:`simulated_pynvml` loads a private copy of the installed ``pynvml`` (the real module's code,
its own globals) and sets its ``nvmlLib`` to a :class:`SimLib` answering from a :class:`SimNode`:
GPUs with UUIDs, memory, processes (with their MIG GPU/compute instance), MIG slices, the event
types each supports, queued events of any device or slice, and the error codes real nodes return
(``NO_PERMISSION`` for a MIG parent's memory inside a container or a handle a device cgroup
denies, ``UNKNOWN`` from a dying GPU, ``GPU_IS_LOST``, ``NOT_SUPPORTED``). The C functions take
the ctypes arguments ``pynvml`` passes (``byref`` out-parameters, handles as pointers) and return
NVML return codes, so every decoding step of ``pynvml`` and of our backend runs.
"""
from __future__ import annotations

import ctypes
import importlib.util
import itertools
import sys
import threading
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable

GiB = 1024**3
SUCCESS, NO_PERMISSION, NOT_SUPPORTED, NOT_FOUND, INSUFFICIENT_SIZE, TIMEOUT, GPU_IS_LOST, UNKNOWN = (
    0, 4, 3, 6, 7, 10, 15, 999)
XID, DBE = 0x8, 0x2  # nvmlEventTypeXidCriticalError, nvmlEventTypeDoubleBitEccError
_COPIES = itertools.count()
_WHOLE = 0xFFFFFFFF  # an event's gpuInstanceId/computeInstanceId when it is the whole GPU's
_MESSAGES = {NO_PERMISSION: b"Insufficient Permissions", NOT_SUPPORTED: b"Not Supported", NOT_FOUND: b"Not Found",
             TIMEOUT: b"Timeout", GPU_IS_LOST: b"GPU is lost", UNKNOWN: b"Unknown Error"}


@dataclass
class SimMig:
    uuid: str
    gi: int
    ci: int
    total: int = 10 * GiB
    used: int = 0
    denied: bool = False  # another tenant's slice: its handle answers NO_PERMISSION


@dataclass
class SimGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    total: int = 80 * GiB
    used: int = 1 * GiB
    procs: dict[int, int] = field(default_factory=dict)  # pid -> bytes
    handle_error: int | None = None  # what nvmlDeviceGetHandleByIndex answers (NO_PERMISSION: a device cgroup)
    memory_error: int | None = None  # what the whole GPU's memory query answers (NO_PERMISSION on a MIG parent)
    query_error: int | None = None  # what every query of it answers (UNKNOWN, GPU_IS_LOST)
    migs: list[SimMig] = field(default_factory=list)
    supported_events: int = XID | DBE
    register_error: int | None = None
    recovery: int | None = None  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION; None: a driver before r570
    ecc: int = 0  # the volatile uncorrectable ECC count


@dataclass
class SimNode:
    gpus: list[SimGpu]
    driver: bytes = b"570.86.15"
    cuda: int = 12080
    events: list[tuple[int, int, int, int, int]] = field(default_factory=list)  # (gpu, type, data, gi, ci)
    registered: dict[int, int] = field(default_factory=dict)  # gpu -> mask
    cond: threading.Condition = field(default_factory=threading.Condition)
    listening: threading.Event = field(default_factory=threading.Event)  # set at the first registration

    def send(self, gpu: int, code: int, *, kind: int = XID, gi: int = _WHOLE, ci: int = _WHOLE) -> None:
        """An event as the driver raises it; only delivered if its type was registered for that GPU."""
        with self.cond:
            self.events.append((gpu, kind, code, gi, ci))
            self.cond.notify_all()


def _v(x: Any) -> Any:
    return x.value if hasattr(x, "value") else x


def _out(ref: Any) -> Any:
    return ref._obj  # the object a byref() points at


def _set_handle(ref: Any, token: int) -> None:
    obj = _out(ref)
    ctypes.memmove(ctypes.addressof(obj), ctypes.byref(ctypes.c_void_p(token)), ctypes.sizeof(ctypes.c_void_p))


def _token(handle: Any) -> int:
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


class _CFunc:
    """A C function: callable, and accepts ``restype`` the way ctypes functions do."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn, self.restype = fn, None

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


class SimLib:
    """``nvmlLib``: the C functions ``pynvml`` looks up by name. A handle is a token: 0x1000 + GPU
    index for a GPU, 0x2000 + 16 * GPU + slot for a MIG device; an event set is 0x9000."""

    def __init__(self, node: SimNode) -> None:
        self.node = node
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> _CFunc:
        impl = getattr(type(self), "c_" + name, None)
        if impl is None:
            raise AttributeError(name)  # pynvml turns this into NVML_ERROR_FUNCTION_NOT_FOUND
        self.calls.append(name)
        return _CFunc(lambda *a: impl(self, *a))

    # --- which device a handle is
    def _gpu(self, handle: Any) -> tuple[int, SimGpu, SimMig | None]:
        t = _token(handle)
        if t >= 0x2000:
            g = (t - 0x2000) // 16
            return g, self.node.gpus[g], self.node.gpus[g].migs[(t - 0x2000) % 16]
        return t - 0x1000, self.node.gpus[t - 0x1000], None

    def _query(self, handle: Any) -> int:
        _, gpu, _ = self._gpu(handle)
        return gpu.query_error or SUCCESS

    # --- library
    def c_nvmlInitWithFlags(self, flags: Any) -> int:
        return SUCCESS

    def c_nvmlShutdown(self) -> int:
        return SUCCESS

    def c_nvmlErrorString(self, result: Any) -> bytes:
        return _MESSAGES.get(int(_v(result)), b"Unknown Error")

    def c_nvmlSystemGetDriverVersion(self, buf: Any, size: Any) -> int:
        buf.value = self.node.driver
        return SUCCESS

    def c_nvmlSystemGetCudaDriverVersion(self, ref: Any) -> int:
        _out(ref).value = self.node.cuda
        return SUCCESS

    def c_nvmlDeviceGetCount_v2(self, ref: Any) -> int:
        _out(ref).value = len(self.node.gpus)
        return SUCCESS

    def c_nvmlDeviceGetHandleByIndex_v2(self, index: Any, ref: Any) -> int:
        i = int(_v(index))
        if i >= len(self.node.gpus):
            return 2  # INVALID_ARGUMENT
        if self.node.gpus[i].handle_error is not None:
            return self.node.gpus[i].handle_error  # type: ignore[return-value]
        _set_handle(ref, 0x1000 + i)
        return SUCCESS

    def c_nvmlDeviceGetHandleByUUID(self, uuid: Any, ref: Any) -> int:
        want = _v(uuid)
        for i, g in enumerate(self.node.gpus):
            if g.uuid.encode() == want:
                return self.c_nvmlDeviceGetHandleByIndex_v2(i, ref)
            for k, m in enumerate(g.migs):
                if m.uuid.encode() == want:
                    _set_handle(ref, 0x2000 + 16 * i + k)
                    return SUCCESS
        return NOT_FOUND

    # --- identity
    def c_nvmlDeviceGetName(self, h: Any, buf: Any, size: Any) -> int:
        _, gpu, mig = self._gpu(h)
        buf.value = (gpu.name + (" MIG 1g.10gb" if mig else "")).encode()
        return self._query(h)

    def c_nvmlDeviceGetUUID(self, h: Any, buf: Any, size: Any) -> int:
        _, gpu, mig = self._gpu(h)
        buf.value = (mig.uuid if mig else gpu.uuid).encode()
        return self._query(h)

    def c_nvmlDeviceGetPciInfo_v3(self, h: Any, ref: Any) -> int:
        i, _, _ = self._gpu(h)
        _out(ref).busId = f"00000000:{i + 0x18:02X}:00.0".encode()
        return self._query(h)

    def c_nvmlDeviceGetIndex(self, h: Any, ref: Any) -> int:
        _out(ref).value = self._gpu(h)[0]
        return SUCCESS

    # --- memory and processes
    def c_nvmlDeviceGetMemoryInfo(self, h: Any, ref: Any) -> int:
        _, gpu, mig = self._gpu(h)
        if gpu.query_error:
            return gpu.query_error
        if mig is None and gpu.memory_error is not None:
            return gpu.memory_error
        m = _out(ref)
        m.total, m.used = (mig.total, mig.used) if mig else (gpu.total, gpu.used)
        m.free = m.total - m.used
        return SUCCESS

    def _procs(self, h: Any, count_ref: Any, array: Any) -> int:
        _, gpu, mig = self._gpu(h)
        if gpu.query_error:
            return gpu.query_error
        procs = [] if mig is not None else sorted(gpu.procs.items())
        count = _out(count_ref)
        if array is None or count.value < len(procs):
            count.value = len(procs)
            return SUCCESS if not procs else INSUFFICIENT_SIZE
        for k, (pid, used) in enumerate(procs):
            array[k].pid, array[k].usedGpuMemory = pid, used
            array[k].gpuInstanceId = array[k].computeInstanceId = _WHOLE
        count.value = len(procs)
        return SUCCESS

    def c_nvmlDeviceGetComputeRunningProcesses_v3(self, h: Any, count_ref: Any, array: Any) -> int:
        return self._procs(h, count_ref, array)

    def c_nvmlDeviceGetGraphicsRunningProcesses_v3(self, h: Any, count_ref: Any, array: Any) -> int:
        _out(count_ref).value = 0
        return self._query(h)

    # --- health
    def c_nvmlDeviceGetTotalEccErrors(self, h: Any, kind: Any, counter: Any, ref: Any) -> int:
        _out(ref).value = self._gpu(h)[1].ecc
        return self._query(h)

    def c_nvmlDeviceGetRetiredPagesPendingStatus(self, h: Any, ref: Any) -> int:
        _out(ref).value = 0
        return self._query(h)

    def c_nvmlDeviceGetRemappedRows(self, h: Any, a: Any, b: Any, c: Any, d: Any) -> int:
        for ref in (a, b, c, d):
            _out(ref).value = 0
        return self._query(h)

    def c_nvmlDeviceGetFieldValues(self, h: Any, n: Any, ref: Any) -> int:
        _, gpu, _ = self._gpu(h)
        values = _out(ref)
        for k in range(int(_v(n))):
            if values[k].fieldId == 230 and gpu.recovery is not None:  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
                values[k].nvmlReturn, values[k].value.uiVal = SUCCESS, gpu.recovery
            else:
                values[k].nvmlReturn = NOT_SUPPORTED
        return self._query(h)

    # --- MIG
    def c_nvmlDeviceGetMigMode(self, h: Any, cur: Any, pending: Any) -> int:
        _, gpu, _ = self._gpu(h)
        _out(cur).value = _out(pending).value = 1 if gpu.migs else 0
        return self._query(h)

    def c_nvmlDeviceGetMaxMigDeviceCount(self, h: Any, ref: Any) -> int:
        _out(ref).value = 7 if self._gpu(h)[1].migs else 0
        return self._query(h)

    def c_nvmlDeviceGetMigDeviceHandleByIndex(self, h: Any, index: Any, ref: Any) -> int:
        i, gpu, _ = self._gpu(h)
        k = int(_v(index))
        if k >= len(gpu.migs):
            return NOT_FOUND
        if gpu.migs[k].denied:
            return NO_PERMISSION
        _set_handle(ref, 0x2000 + 16 * i + k)
        return SUCCESS

    def c_nvmlDeviceGetGpuInstanceId(self, h: Any, ref: Any) -> int:
        mig = self._gpu(h)[2]
        if mig is None:
            return 2
        _out(ref).value = mig.gi
        return SUCCESS

    def c_nvmlDeviceGetComputeInstanceId(self, h: Any, ref: Any) -> int:
        mig = self._gpu(h)[2]
        if mig is None:
            return 2
        _out(ref).value = mig.ci
        return SUCCESS

    def c_nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, h: Any, ref: Any) -> int:
        _set_handle(ref, 0x1000 + self._gpu(h)[0])
        return SUCCESS

    # --- events
    def c_nvmlDeviceGetSupportedEventTypes(self, h: Any, ref: Any) -> int:
        _out(ref).value = self._gpu(h)[1].supported_events
        return self._query(h)

    def c_nvmlEventSetCreate(self, ref: Any) -> int:
        _set_handle(ref, 0x9000)
        return SUCCESS

    def c_nvmlEventSetFree(self, es: Any) -> int:
        return SUCCESS

    def c_nvmlDeviceRegisterEvents(self, h: Any, types: Any, es: Any) -> int:
        i, gpu, _ = self._gpu(h)
        mask = int(_v(types))
        if gpu.register_error is not None:
            return gpu.register_error
        if mask & ~gpu.supported_events:
            return NOT_SUPPORTED  # NVML registers nothing of a mask holding an unsupported type
        self.node.registered[i] = mask
        self.node.listening.set()
        return SUCCESS

    def c_nvmlEventSetWait_v2(self, es: Any, ref: Any, timeout_ms: Any) -> int:
        node = self.node
        with node.cond:
            node.cond.wait_for(lambda: any(node.registered.get(e[0], 0) & e[1] for e in node.events),
                               timeout=int(_v(timeout_ms)) / 1000)
            for k, (gpu, kind, code, gi, ci) in enumerate(node.events):
                if node.registered.get(gpu, 0) & kind:
                    del node.events[k]
                    data = _out(ref)
                    data.device = ctypes.cast(ctypes.c_void_p(0x1000 + gpu), type(data.device))
                    data.eventType, data.eventData, data.gpuInstanceId, data.computeInstanceId = kind, code, gi, ci
                    return SUCCESS
        return TIMEOUT


def simulated_pynvml(node: SimNode) -> ModuleType:
    """A private copy of the installed ``pynvml`` (its own globals) whose C library is ``node``'s."""
    import pynvml

    name = f"pynvml_simulated_{next(_COPIES)}"
    spec = importlib.util.spec_from_file_location(name, pynvml.__file__)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # pynvml builds its error classes through sys.modules[__name__]
    try:
        spec.loader.exec_module(mod)
    finally:
        del sys.modules[name]
    mod.nvmlLib = SimLib(node)  # type: ignore[attr-defined]
    return mod
