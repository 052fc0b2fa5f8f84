"""GpuMonitor: watches every GPU through a :class:`~supervisor.health.gpu.GpuBackend`.

Emits (never acts):

* ``gpu_memory`` when a device stays above ``gpu.memory_watermark`` for ``gpu.memory_polls``
  consecutive polls; ``details`` carry the trend (``slope_bytes_per_s``, ``seconds_to_exhaustion``
  from a least-squares line over the recent readings) and the job tree's share of the memory;
* ``gpu_fault`` for an Xid event (code, meaning and suggested action from :mod:`.xid`), a
  double-bit ECC error (event or a rising volatile uncorrectable count), a lost GPU, or a GPU
  that vanished since the attempt started.

NVML missing or failing is *not* a failure cause: the monitor logs one ``gpu_blind`` event, calls
``on_blind(reason)``, and ``status()`` says ``{"available": false, "reason": ...}``; ``gpus()``
is ``None``. It never reports a device as fine when it cannot see it.

One instance lives for the whole daemon: ``start``/``stop`` per attempt (the blind line is logged
once per instance). With ``threaded=True`` polling runs on a thread of its own and Xid/ECC events
on another; ``poll(now)`` is then a no-op. With ``threaded=False`` (tests, fake clock) ``poll(now)``
polls when due and drains pending events without blocking.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Callable, Mapping, Sequence

import structlog

from ..events import Action, AttemptContext, Cause, Emit
from ..core.observations import Detection
from .config import GpuConfig
from .gpu import DeviceInfo, GpuBackend, GpuBlindError, GpuDeviceError, GpuEvent, GpuEventKind, GpuLostError
from .devices import Selection, resolve
from .gpuevents import drain_stale, foreign, note_foreign
from .gpureading import DeviceReading, job_tree_pids, linear_slope, read_device
from .xid import NODE_ADVICE, classify_xid

log = structlog.get_logger("supervisor.health")

# Consecutive failed poll cycles (not lost, not blind: e.g. NVML_ERROR_UNKNOWN) before we call
# ourselves blind rather than keep showing stale numbers.
_FAILURES_BEFORE_BLIND = 3
_TREND_SAMPLES = 30
# Consecutive polls one device answers NVML_ERROR_UNKNOWN (the others read fine) before it is called
# lost: a GPU that died often answers so rather than GPU_IS_LOST.
_UNKNOWN_POLLS_LOST = 3
_ECC_XIDS = frozenset({48, 94, 95})  # double-bit, contained, uncontained: the Xids of an ECC error


class GpuMonitor:
    """See the module doc. ``clock`` is monotonic seconds (trend and poll scheduling)."""

    name = "gpu"

    def __init__(self, backend: GpuBackend, cfg: GpuConfig | None = None, *,
                 clock: Callable[[], float] = time.monotonic, threaded: bool = True,
                 on_blind: Callable[[str], None] | None = None, env: Mapping[str, str] | None = None) -> None:
        self._backend = backend
        self._env = dict(env or {})  # the job's environment: its CUDA_VISIBLE_DEVICES (health/devices.py)
        self._sel = Selection((), True, "not resolved")
        self._cfg = cfg or GpuConfig()
        self._clock = clock
        self._threaded = threaded
        self._on_blind = on_blind
        self._lock = threading.RLock()
        self._emit: Emit | None = None
        self._ctx: AttemptContext | None = None
        self._initialized = False
        self._blind_reason: str | None = None
        self._blind_logged = False
        self._infos: dict[int, DeviceInfo] = {}
        self._readings: dict[int, DeviceReading] = {}
        self._faults: dict[int, list[str]] = {}
        self._driver: str | None = None
        self._cuda: str | None = None
        self._start_count = 0
        self._next_poll = 0.0
        self._failures = 0
        self._errors_logged: set[str] = set()
        # per-attempt detection state
        self._above: dict[int, int] = {}
        self._memory_reported: set[int] = set()
        self._trend: dict[int, deque[tuple[float, float]]] = {}
        self._lost_reported: set[int] = set()
        self._ecc_base: dict[int, int] = {}
        self._ecc_reported: set[int] = set()
        self._unknown_polls: dict[int, int] = {}
        self._unknown_said: set[tuple[int, str]] = set()
        self._job_pids: frozenset[int] = frozenset()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.polls = 0

    # ----------------------------------------------------------------- lifecycle (events.Monitor)
    def start(self, ctx: AttemptContext | None, emit: Emit) -> None:
        with self._lock:
            self._ctx, self._emit = ctx, emit
            self._reset_attempt_state()
            if not self._ensure_init():
                return
            bind = getattr(self._backend, "bind_job", None)
            if callable(bind):  # only the fake has it: "job" in its timeline means this pid
                bind(ctx.pid if ctx else None)
            self._start_count = len(self._infos)
            self._next_poll = 0.0
            if self._cfg.events:
                self._safely(lambda: drain_stale(self._backend), "events")
        if self._threaded:
            self._stop.clear()
            self._threads = [threading.Thread(target=self._poll_loop, name="tsup-gpu-poll", daemon=True)]
            if self._cfg.events:
                self._threads.append(threading.Thread(target=self._event_loop, name="tsup-gpu-events",
                                                      daemon=True))
            for t in self._threads:
                t.start()

    def poll(self, now: float) -> None:
        if self._threaded or self._emit is None:
            return
        if self.available and self._cfg.events:
            self._safely(lambda: self._handle_events(self._backend.wait_events(0.0)), "events")
        if now >= self._next_poll:
            self._next_poll = now + self._cfg.poll_s
            self.check()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5.0)
        self._threads = []
        with self._lock:
            self._emit = None

    def close(self) -> None:
        """At daemon exit: stop and release NVML."""
        self.stop()
        try:
            self._backend.shutdown()
        except Exception:  # nothing useful to do at exit
            pass

    # ----------------------------------------------------------------- what others read
    @property
    def available(self) -> bool:
        return self._initialized and self._blind_reason is None

    def status(self) -> Mapping[str, object]:
        with self._lock:
            if not self.available:
                return {"available": False, "state": "unavailable",
                        "reason": self._blind_reason or "not started", "devices": None}
            gpus = self.gpus()
            state = "unknown" if not self._readings else (
                "fault" if any(self._faults.values()) else "ok")
            return {"available": True, "state": state, "reason": None, "devices": gpus,
                    "driver": self._driver, "cuda": self._cuda}

    def gpus(self) -> list[dict[str, object]] | None:
        """``status --json`` "gpus": one dict per device, or None when blind (never a fake "ok")."""
        with self._lock:
            if not self.available:
                return None
            return [r.to_status(self._faults.get(i, [])) for i, r in sorted(self._readings.items())]

    def snapshot(self) -> dict[str, object]:
        """For the ledger (each attempt): driver, CUDA, names, UUIDs and memory per device."""
        with self._lock:
            if not self.available:
                return {"available": False, "reason": self._blind_reason or "not started"}
            devices = []
            for i, info in sorted(self._infos.items()):
                r = self._readings.get(i)
                devices.append({
                    "index": i, "name": info.name, "uuid": info.uuid, "pci_bus_id": info.pci_bus_id,
                    "memory_used_bytes": r.memory.used if r and r.memory else None,
                    "memory_total_bytes": r.memory.total if r and r.memory else None,
                    "job_memory_bytes": r.job_bytes if r else None,
                    "lost": r.lost if r else None,
                })
            return {"available": True, "driver": self._driver, "cuda": self._cuda,
                    "device_count": len(self._infos), "devices": devices, "job_devices": self._sel.to_dict()}

    # ----------------------------------------------------------------- internals
    def _reset_attempt_state(self) -> None:
        self._above.clear()
        self._memory_reported.clear()
        self._trend.clear()
        self._lost_reported.clear()
        self._ecc_base.clear()
        self._ecc_reported.clear()
        self._faults.clear()
        self._readings.clear()
        self._unknown_polls.clear()

    def _ensure_init(self) -> bool:
        if self._initialized and self._blind_reason is None:
            return True
        try:
            self._backend.init()
            count = self._backend.device_count()
            infos: dict[int, DeviceInfo] = {}
            for i in range(count):
                try:
                    infos[i] = self._backend.device_info(i)
                except (GpuLostError, GpuDeviceError):  # shown as lost / unknown by the polls
                    infos[i] = DeviceInfo(i, "?", "?", "?")
            self._driver = self._backend.driver_version()
            self._cuda = self._backend.cuda_driver_version()
            self._sel = resolve(self._backend, self._cfg.devices, self._env)
        except GpuBlindError as exc:
            self._go_blind(str(exc))
            return False
        except Exception as exc:  # any NVML surprise at start means we cannot see
            self._go_blind(f"GPU backend failed at start: {exc!r}")
            return False
        was_blind = self._blind_logged
        self._infos, self._initialized, self._blind_reason, self._failures = infos, True, None, 0
        log.info("gpu_monitor_started", devices=count, driver=self._driver, cuda=self._cuda,
                 names=sorted({i.name for i in infos.values()}), restored=was_blind or None)
        return True

    def _go_blind(self, reason: str) -> None:
        self._blind_reason = reason
        if not self._blind_logged:
            self._blind_logged = True
            log.warning("gpu_blind", reason=reason,
                        next="GPU health is unavailable: no gpu_memory or gpu_fault "
                             "detection until NVML works; the job keeps running")
        if self._on_blind is not None:
            try:
                self._on_blind(reason)
            except Exception:  # a callback must not kill the monitor
                log.exception("gpu_on_blind_callback_failed")

    def _safely(self, fn: Callable[[], Any], what: str) -> bool:
        """Run ``fn``; survive anything, log each distinct error once, go blind when NVML breaks."""
        try:
            fn()
            return True
        except GpuBlindError as exc:
            with self._lock:
                self._go_blind(str(exc))
            return False
        except Exception as exc:  # the monitor outlives its own bugs
            key = f"{what}:{type(exc).__name__}"
            if key not in self._errors_logged:
                self._errors_logged.add(key)
                log.exception("gpu_monitor_error", during=what, error=repr(exc),
                              next="skipping this poll; the monitor keeps running")
            return False

    def check(self) -> None:
        """One poll of every device (thread-safe; the poll thread and tests call it)."""
        if not self.available:
            return
        ok = self._safely(self._check_once, "poll")
        with self._lock:
            self._failures = 0 if ok else self._failures + 1
            if self._failures >= _FAILURES_BEFORE_BLIND and self._blind_reason is None:
                self._go_blind(f"{self._failures} GPU polls in a row failed")

    def _check_once(self) -> None:
        now = self._clock()
        pids = job_tree_pids(self._ctx.pid if self._ctx else None)
        count = self._backend.device_count()
        mine = [i for i in range(count) if self._sel.watches(i)]  # the job's GPUs only (devices.py)
        readings = {i: read_device(self._backend, i, pids, self._infos.get(i), self._sel.slices(i)) for i in mine}
        with self._lock:
            self.polls += 1
            self._job_pids = pids
            self._readings = readings
            for i in range(count, self._start_count):
                if i not in self._lost_reported and self._sel.watches(i):
                    self._readings[i] = DeviceReading(i, self._infos.get(i), lost=True)
                    self._report_lost(i, f"{self._label(i)} disappeared (NVML now sees {count} of "
                                         f"{self._start_count} devices)")
            for i, r in readings.items():
                if r.lost:
                    self._report_lost(i, f"{self._label(i)} is lost (fell off the bus)")
                    continue
                if r.unknown is not None:
                    self._check_unknown(r)
                    continue
                self._unknown_polls.pop(i, None)
                self._check_memory(now, r)
                self._check_ecc(r)

    def _check_memory(self, now: float, r: DeviceReading) -> None:
        mem = r.memory
        if mem is None or mem.total <= 0:
            return
        trend = self._trend.setdefault(r.index, deque(maxlen=_TREND_SAMPLES))
        trend.append((now, float(mem.used)))
        if mem.fraction < self._cfg.memory_watermark:
            self._above[r.index] = 0
            self._memory_reported.discard(r.index)  # recovered: a later climb is news again
            return
        self._above[r.index] = self._above.get(r.index, 0) + 1
        if self._above[r.index] < self._cfg.memory_polls or r.index in self._memory_reported:
            return
        self._memory_reported.add(r.index)
        slope = linear_slope(list(trend))
        eta = (mem.total - mem.used) / slope if slope and slope > 0 else None
        name = r.info.name if r.info else "?"
        when = f"; full in ~{eta:.0f} s at the current slope" if eta is not None else ""
        self._fault(r.index, "memory_watermark")
        self._send(Detection(
            at=time.time(), cause=Cause.GPU_MEMORY,
            summary=(f"{self._label(r.index)} {name} memory at {mem.fraction:.1%} of "
                     f"{mem.total / 2**30:.1f} GiB for {self._above[r.index]} polls{when}"),
            source="nvml", value=mem.fraction,
            evidence=f"used={mem.used} total={mem.total} job={r.job_bytes}",
            details={"device": r.index, "uuid": r.info.uuid if r.info else None,
                     "used_bytes": mem.used, "total_bytes": mem.total, "fraction": mem.fraction,
                     "watermark": self._cfg.memory_watermark, "polls_above": self._above[r.index],
                     "slope_bytes_per_s": slope, "seconds_to_exhaustion": eta,
                     "job_memory_bytes": r.job_bytes}))

    def _check_unknown(self, r: DeviceReading) -> None:
        """A device NVML cannot read (the others still are): said once per device and kind; an
        UNKNOWN answer that persists is a lost GPU; a refusal (permission, MIG parent, device
        cgroup) stays "unknown": never a crash, never "fine", never a stop."""
        kind = r.unknown_kind or "unknown"
        if (r.index, kind) not in self._unknown_said:
            self._unknown_said.add((r.index, kind))
            log.warning("gpu_device_unknown", device=r.index, uuid=self._uuid(r.index), kind=kind, reason=r.unknown,
                        next=("called lost if it persists" if kind == "unknown" else
                              "this GPU is shown as unknown; the other GPUs are watched as before"))
        if f"unknown_{kind}" not in self._faults.get(r.index, []):
            self._fault(r.index, f"unknown_{kind}")
        if kind != "unknown":
            return
        n = self._unknown_polls[r.index] = self._unknown_polls.get(r.index, 0) + 1
        if n >= _UNKNOWN_POLLS_LOST:
            self._report_lost(r.index, f"{self._label(r.index)} answers NVML_ERROR_UNKNOWN ({n} polls in a row) "
                                       "while the other GPUs read fine: treated as lost", evidence=str(r.unknown))

    def _check_ecc(self, r: DeviceReading) -> None:
        if r.ecc_uncorrected is None:
            return
        base = self._ecc_base.setdefault(r.index, r.ecc_uncorrected)
        if r.ecc_uncorrected > base and r.index not in self._ecc_reported:
            self._report_ecc(r.index, f"volatile uncorrectable ECC count rose {base} -> {r.ecc_uncorrected}")

    def _report_ecc(self, index: int, evidence: str) -> None:
        """One decision per device for an uncorrectable ECC error, whichever of its signs comes first
        (the event, the counter, Xid 94/48/95): a contained error (the driver's recovery action
        says none is needed, r570+) is the application's, like Xid 94; else ``gpu.ecc_action``."""
        self._ecc_reported.add(index)
        try:
            contained = self._backend.recovery_action(index) == 0
        except Exception:  # an unreadable field is no evidence of containment
            contained = False
        action = Action.RESTART if contained else Action(self._cfg.ecc_action)
        what = ("contained: the driver needs no recovery action, the job restarts" if contained
                else "the GPU needs a reset")
        self._fault(index, "ecc_double_bit")
        self._send(Detection(
            at=time.time(), cause=Cause.GPU_FAULT, source="nvml", evidence=evidence, suggested_action=action,
            summary=f"double-bit (uncorrectable) ECC error on {self._label(index)}: {what}; "
                    f"suggested action {action.value}",
            details={"kind": "ecc_double_bit", "device": index, "uuid": self._uuid(index),
                     "advice": "reset the GPU (drain or reset this node)"}))

    def _report_lost(self, index: int, summary: str, evidence: str = "NVML_ERROR_GPU_IS_LOST") -> None:
        if index in self._lost_reported:
            return
        self._lost_reported.add(index)
        action = Action(self._cfg.lost_action)
        self._fault(index, "lost")
        self._send(Detection(
            at=time.time(), cause=Cause.GPU_FAULT, source="nvml", summary=f"{summary}: {NODE_ADVICE}",
            evidence=evidence, suggested_action=action,
            details={"kind": "gpu_lost", "device": index, "uuid": self._uuid(index), "advice": NODE_ADVICE}))

    def _handle_events(self, events: Sequence[GpuEvent]) -> None:
        with self._lock:
            for ev in events:
                info = None if ev.kind == GpuEventKind.ECC_DBE else classify_xid(
                    ev.code or 0, self._cfg.xid_actions, self._cfg.xid_default_action)
                why = foreign(ev, info, self._sel, self._readings, self._job_pids)
                if why is not None:
                    note_foreign(ev, why, self._label(ev.index))
                    continue
                if info is None:
                    if ev.index not in self._ecc_reported:
                        self._report_ecc(ev.index, "NVML double-bit ECC event")
                    continue
                if info.code in _ECC_XIDS:  # the ECC error's own Xid: one decision with the ECC signs
                    if ev.index in self._ecc_reported:
                        continue
                    self._ecc_reported.add(ev.index)
                self._fault(ev.index, f"xid_{info.code}")
                self._send(Detection(
                    at=time.time(), cause=Cause.GPU_FAULT, source="nvml", value=float(info.code),
                    summary=f"Xid {info.code} on {self._label(ev.index)}: {info.meaning}; {info.advice}",
                    evidence=f"NVML Xid critical error event, code {info.code}",
                    suggested_action=info.action,
                    details={"kind": "xid", "code": info.code, "meaning": info.meaning,
                             "level": info.level.value, "device": ev.index, "uuid": self._uuid(ev.index),
                             "advice": info.advice}))

    def _label(self, index: int) -> str:
        return self._sel.label(index, self._uuid(index))

    def _uuid(self, index: int) -> str | None:
        info = self._infos.get(index)
        return info.uuid if info else None

    def _fault(self, index: int, what: str) -> None:
        self._faults.setdefault(index, []).append(what)

    def _send(self, det: Detection) -> None:
        log.warning("gpu_detection", cause=det.cause.value, summary=det.summary,
                    suggested_action=det.suggested_action.value if det.suggested_action else None)
        emit = self._emit
        if emit is not None:
            emit(det)

    # ----------------------------------------------------------------- threads
    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            self.check()
            self._stop.wait(self._cfg.poll_s)

    def _event_loop(self) -> None:
        backoff = 0.0
        while not self._stop.is_set():
            if not self.available:
                self._stop.wait(self._cfg.poll_s)
                continue
            try:
                self._handle_events(self._backend.wait_events(0.25))  # short: stop() joins us
                backoff = 0.0
            except GpuLostError as exc:
                # the event wait cannot say which GPU; the poll loop pins it down by index
                log.warning("gpu_event_wait_lost", error=str(exc), next="the poll loop reports which GPU")
                backoff = min(max(backoff * 2, 1.0), 30.0)
            except GpuBlindError as exc:
                with self._lock:
                    self._go_blind(str(exc))
            except Exception as exc:  # events are a bonus: polling still sees ECC/lost
                if "events" not in self._errors_logged:
                    self._errors_logged.add("events")
                    log.warning("gpu_events_failed", error=repr(exc),
                                next="retrying with backoff; memory/ECC/lost polling continues")
                backoff = min(max(backoff * 2, 1.0), 30.0)
            if backoff:
                self._stop.wait(backoff)
