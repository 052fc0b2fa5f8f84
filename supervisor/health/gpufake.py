"""A scripted GPU node for tests: :class:`FakeBackend` implements :class:`~.gpu.GpuBackend` by
replaying a timeline (memory creep, Xid events, ECC errors, a lost GPU, per-process memory)
against an injectable clock. It is never chosen by configuration: :func:`~.nvml.make_backend`
knows ``nvml`` and ``none``, and no environment variable or config value switches a node's GPU
health to a fake. Tests construct it (or :meth:`FakeBackend.from_file` a JSON timeline) and hand
it to the monitor or the gate; the end-to-end tests start the real daemon through
``tests/helpers/fake_gpu_daemon.py``, which replaces the backend factory in its own process.

Timeline JSON::

    {"devices": 8, "total_gb": 80, "name": "Fake H100",          # or "devices": [{"uuid": ..., "migs":
                                                                   #   [{"uuid": "MIG-..", "gi": 1, "ci": 0}]}, ...]
     "init_error": null,                                          # a string: the backend is blind
     "timeline": [[0, {"memory": {"device": 0, "used_frac": 0.5}}],
                  [2, {"memory_ramp": {"device": 0, "to_frac": 0.995, "over_s": 5}}],
                  [3, {"xid": {"device": 1, "code": 79}}],
                  [4, {"ecc_dbe": {"device": 2}}],
                  [5, {"lost": {"device": 3}}],
                  [6, {"processes": {"device": 0, "pids": {"job": 1073741824}}}],
                  [7, {"pending": {"device": 4, "retired_pages": true, "remap": false}}],
                  [8, {"deny": {"device": 5, "query": "memory", "error": "no_permission"}}],
                  [9, {"recovery": {"device": 6, "action": 1}}],
                  [10, {"xid": {"device": 7, "code": 43, "gi": 1, "ci": 0}}]]}

``deny`` makes NVML refuse a device's ``memory`` (a MIG parent in a container), its ``handle``
(every query: a device cgroup) or ``all`` with ``no_permission``, ``not_supported`` or ``unknown``
(a dying GPU), as :class:`~.nvml.NvmlBackend` reports them (:class:`~.gpu.GpuDeviceError`);
``"error": null`` lifts it. ``recovery`` sets the driver's GPU recovery action field.

``t`` counts from :meth:`FakeBackend.init`. In ``processes`` the pid ``"job"`` stands for the pid
given to :meth:`FakeBackend.bind_job` (the monitor binds the job's pid when an attempt starts).
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from .gpu import (GiB, DeviceInfo, GpuBlindError, GpuDeviceError, GpuEvent, GpuEventKind, GpuLostError,
                  MemoryInfo, MigInfo, PendingRepair)


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
    denied: dict[str, str] = field(default_factory=dict)  # query ("memory", "handle") -> error kind
    recovery: int | None = None
    migs: tuple[MigInfo, ...] = ()


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
                        int(float(s.get("total_gb", total_gb)) * GiB),
                        migs=tuple(MigInfo(str(m["uuid"]), int(m["gi"]), int(m["ci"])) for m in s.get("migs", ())))
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
                self._events.append(GpuEvent(GpuEventKind.XID, dev.info.index, int(a["code"]),
                                             gpu_instance=a.get("gi"), compute_instance=a.get("ci")))
            elif kind == "deny" and dev:
                query = str(a.get("query", "handle"))
                if a.get("error") is None:
                    dev.denied.pop(query, None)
                else:
                    dev.denied[query] = str(a["error"])
            elif kind == "recovery" and dev:
                dev.recovery = int(a.get("action", 0))
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

    def _dev(self, index: int, query: str = "") -> tuple[_FakeDevice, float]:
        t = self._advance()
        self.calls += 1
        if self._init_error is not None:
            raise GpuBlindError(f"NVML stopped working: {self._init_error}")
        dev = self._devices[index]
        if dev.lost:
            raise GpuLostError(index)
        for q in ("handle", "all", query):
            kind = dev.denied.get(q) if q else None
            if kind is not None:
                raise GpuDeviceError(index, kind, f"GPU {index}: NVML answered {kind} for its {q} (fake)")
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
        dev, t = self._dev(index, "memory")
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

    def recovery_action(self, index: int) -> int | None:
        return self._dev(index)[0].recovery

    def mig_devices(self, index: int) -> Sequence[MigInfo]:
        return self._dev(index)[0].migs

    def mig_memory(self, index: int, uuid: str) -> MemoryInfo:
        dev, _ = self._dev(index)
        if uuid not in {m.uuid for m in dev.migs}:
            raise GpuDeviceError(index, "not_found", f"GPU {index} has no MIG device {uuid} (fake)")
        return MemoryInfo(0, dev.total // max(1, len(dev.migs)))  # the fake's slices are idle

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
