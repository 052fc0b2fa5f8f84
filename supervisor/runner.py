"""The runner: the main loop, and the only place that acts.

Monitors observe and put events on one queue; signal handlers only record; the loop takes the
events in order, asks the pure policy what to do, and does it.

::

    State machine (every transition is logged as an event):

      STARTING --spawned--> RUNNING --job exit 0--------------------------------> FINISHED
         |                    |   \\--failure detected / restart / stop--> STOPPING
         |                    \\--job exited (failure)--+                      |
         |                                             v                      v
         +--gate or spawn failed--> GAVE_UP <--give up-- (decide) <--group gone--+
                                                       | relaunch          \\--stop requested--> STOPPED
                                                       v
                                                    BACKOFF --delay over--> STARTING
                                                       \\--stop requested--> STOPPED
"""

from __future__ import annotations

import os
import queue
import random
import signal
import sys
import threading
import time
from collections import Counter, deque
from concurrent.futures import Future
from dataclasses import dataclass, fields, is_dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, BinaryIO, Mapping

import structlog

from . import configschema
from .config import Config, ConfigError, load_config, signal_number
from .envsnapshot import snapshot, world_from_launch
from .events import Action, AttemptContext, Cause, Detection, MetricRecord, Monitor
from .ledger import Ledger
from .osapi import Clock, OsApi, ProcRef, become_subreaper
from .output import SinkFanout
from .parts import Parts, build_parts
from .policy import Decision, Failure, PastAttempt, decide, merge_args
from .process import (ExitInfo, JobProcess, LaunchSpec, cgroup_oom_kills, classify_exit, is_secret, job_python,
                      redact_env)
from .shutdown import Mode, Shutdown, ShutdownPlan
from .watch.logwatch import metric_dict

log = structlog.get_logger("supervisor.runner")

EXIT_OK = 0
EXIT_CONFIG = 2
EXIT_GAVE_UP = 3

TICK_S = 0.1
# Config sections whose objects are built once at daemon start: a reload records them, a
# daemon restart applies them. job, policy, shutdown, on, validation apply at the next launch.
RESTART_SECTIONS = ("state", "log", "heartbeat", "detectors", "checkpoints", "gpu", "host", "metrics", "systemd")
EXIT_DRAIN_S = 1.0  # after the leader exits, how long to wait for the last output lines
# systemd's own variables must not leak into the job: a job that inherits NOTIFY_SOCKET or
# WATCHDOG_USEC could ping systemd on our behalf.
_STRIP_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID",
              "LISTEN_FDNAMES", "INVOCATION_ID")


class State(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    BACKOFF = "backoff"
    STOPPED = "stopped"
    GAVE_UP = "gave_up"
    FINISHED = "finished"


@dataclass(frozen=True)
class Resume:
    checkpoint: str | None
    step: int | None
    reason: str


@dataclass
class Pending:
    """What happens once the current stop completes."""

    decision: Decision | None = None  # relaunch or give up
    exit_after: bool = False  # an operator stop: exit 0
    explicit_checkpoint: str | None = None  # restart --from


def _jsonable(v: Any) -> Any:
    if is_dataclass(v) and not isinstance(v, type):
        return {f.name: _jsonable(getattr(v, f.name)) for f in fields(v)}
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, StrEnum):
        return v.value
    return v


def config_json(cfg: Config) -> dict[str, Any]:
    """The config as stored in the ledger: secret-looking values of job.env masked."""
    js = _jsonable(cfg)
    js["job"]["env"] = redact_env(js["job"]["env"])
    return js


def detection_dict(d: Detection) -> dict[str, Any]:
    return {"cause": d.cause.value, "summary": d.summary, "source": d.source, "step": d.step,
            "onset_step": d.onset_step, "value": d.value, "evidence": d.evidence,
            "details": _jsonable(d.details), "at": d.at}


class Runner:
    def __init__(self, cfg: Config, *, config_path: Path | None = None, osapi: OsApi | None = None,
                 clock: Clock | None = None, passthrough: BinaryIO | None = None,
                 parts: Parts | None = None, rng: random.Random | None = None) -> None:
        self.cfg = cfg
        self.config_path = config_path
        self.osapi = osapi or OsApi()
        self.clock = clock or Clock()
        self.passthrough = passthrough if passthrough is not None else sys.stdout.buffer
        self.rng = rng or random.Random()
        self.q: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self.state_dir = cfg.state_dir().resolve()
        self.state = State.STARTING
        self.exit_code: int | None = None
        self.exit_reason = ""
        self.run_id = ""
        self.attempt = -1
        self.job: JobProcess | None = None
        self.shutdown: Shutdown | None = None
        self.pending = Pending()
        self.root: Detection | None = None  # first failure observed in this attempt
        self.exit_seen_at: float | None = None
        self.backoff_until = 0.0
        self.attempt_started = 0.0
        self.attempt_started_wall = 0.0
        self.resume = Resume(None, None, "fresh start")
        self.history: list[PastAttempt] = []
        self.restarts_by_cause: Counter[str] = Counter()
        self.remedy_env: dict[str, str] = {}
        self.remedy_args: list[str] = []
        self.skip_batches = 0
        self.diagnostics = False
        self.monitors: list[Monitor] = []
        self.failed_monitors: set[str] = set()
        self.fanout = SinkFanout()
        self.metrics_buf: deque[MetricRecord] = deque(maxlen=100_000)
        self.last_metric: MetricRecord | None = None
        self.last_anomaly: Detection | None = None
        self.snapshot_cache: dict[str, Any] | None = None
        self.stop_requests = 0
        self.oom_kills_before: int | None = None
        self.parts = parts
        self.preparing: Future[tuple[Any, Any]] | None = None
        self._attempt_snapshot: dict[str, Any] | None = None
        self.metric_history: deque[MetricRecord] = deque(maxlen=50_000)
        self._status_cache: dict[str, Any] = {}
        self._last_status_line = ""

    # ================================================================== life cycle
    def run(self) -> int:
        become_subreaper()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.ledger = Ledger(self.state_dir)
        if self.parts is None:
            self.parts = build_parts(self)
        self.run_id, continued = self.ledger.open_run(self.cfg.job.name, config_json(self.cfg))
        structlog.contextvars.bind_contextvars(run_id=self.run_id)
        self._install_signals()
        try:
            self.parts.start_daemon_side(self)
        except Exception as e:
            self._event("daemon_start_failed", "error", f"cannot start: {e}")
            self.ledger.end_run(self.run_id, "gave_up", EXIT_GAVE_UP, str(e))
            return EXIT_GAVE_UP
        self._event("daemon_started", "info",
                    f"supervising run {self.run_id} ({'continuing after a daemon restart' if continued else 'new run'}); "
                    f"state dir {self.state_dir}", continued=continued, pid=os.getpid())
        if continued:
            self._adopt_previous_life()
        self._launch()
        try:
            while self.exit_code is None:
                self._wait_and_handle()
                self._tick()
        finally:
            self._cleanup()
        return self.exit_code

    def _cleanup(self) -> None:
        for m in self.monitors:
            self._guard(m, "stop")
        self.monitors = []
        if self.job is not None:
            self.job.close()
        assert self.parts is not None
        self.parts.stop_daemon_side(self)
        self.ledger.close()

    def _install_signals(self) -> None:
        # Handlers only record (SimpleQueue.put is reentrant-safe); the loop decides.
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, lambda s, _f: self.q.put(("signal", s)))

    # ================================================================== the loop
    def _next_timeout(self) -> float:
        now = self.clock.monotonic()
        t = TICK_S
        if self.state is State.BACKOFF:
            t = min(t, max(0.0, self.backoff_until - now))
        return max(0.001, t)

    def _wait_and_handle(self) -> None:
        try:
            item = self.q.get(timeout=self._next_timeout())
        except queue.Empty:
            return
        self._handle(item)
        self._drain_queue()

    def _drain_queue(self) -> None:
        """Handle what is already queued, without waiting (bounded, so a flood cannot starve the tick)."""
        for _ in range(1000):
            try:
                item = self.q.get_nowait()
            except queue.Empty:
                return
            self._handle(item)

    def _handle(self, item: tuple[Any, ...]) -> None:
        kind = item[0]
        try:
            if kind == "signal":
                self._on_signal(item[1])
            elif kind == "detection":
                self._on_detection(item[1])
            elif kind == "control":
                _kind, verb, args, fut = item
                try:
                    fut.set_result(self._on_control(verb, args))
                except Exception as e:
                    fut.set_exception(e)
            elif kind in ("eof", "wake"):
                pass  # wakes the loop; _tick acts
        except Exception as e:  # the daemon must survive its own bugs
            log.exception("runner_handler_failed", item=kind, error=repr(e),
                          message="internal error while handling an event; the daemon keeps going")

    def _tick(self) -> None:
        try:
            self._tick_inner()
        except Exception as e:  # the daemon must survive its own parts failing
            log.exception("runner_tick_failed", error=repr(e),
                          message="internal error in the main loop; the job keeps running and the loop goes on")

    def _tick_inner(self) -> None:
        now = self.clock.monotonic()
        self._drain_metrics()
        if self.job is not None and self.state in (State.STARTING, State.RUNNING, State.STOPPING):
            self.job.refresh_tree(now)
            self.job.reap_orphans()
            for m in list(self.monitors):
                self._guard(m, "poll", now)
            self._check_job_exit(now)
        if self.state is State.STOPPING and self.shutdown is not None:
            if self.shutdown.poll(now) and self._job_output_done(now):
                self._after_stop(now)
        if self.state is State.BACKOFF and now >= self.backoff_until:
            self._launch()
        if self.preparing is not None and self.preparing.done() and self.exit_code is None:
            self._spawn(self.preparing)
        assert self.parts is not None
        self.parts.tick(self, now)

    # ================================================================== monitors
    def emit(self, d: Detection) -> None:
        """Thread-safe: monitors call this from any thread."""
        self.q.put(("detection", d))

    def on_metric(self, rec: MetricRecord) -> None:
        """Thread-safe: parsers and the client metrics reader call this."""
        self.last_metric = rec
        self.metrics_buf.append(rec)

    def _guard(self, m: Any, method: str, *args: Any) -> Any:
        name = getattr(m, "name", type(m).__name__)
        if name in self.failed_monitors and method != "stop":
            return None
        try:
            return getattr(m, method)(*args)
        except Exception as e:
            if name not in self.failed_monitors:
                self.failed_monitors.add(name)
                self._event("monitor_failed", "error",
                            f"monitor {name} failed in {method}: {e!r}; it is disabled for this attempt, "
                            "the job keeps running", monitor=name)
            return None

    def _drain_metrics(self) -> None:
        batch = []
        while self.metrics_buf:
            batch.append(self.metrics_buf.popleft())
        if not batch:
            return
        if self.state is State.STARTING:
            self._set_state(State.RUNNING, "first metric seen")
        assert self.parts is not None
        self.metric_history.extend(batch)
        self.parts.on_metrics(self, batch)
        rows = [(r.at, r.step, r.loss, r.grad_norm, r.tokens_per_sec, r.val_loss) for r in batch]
        try:
            self.ledger.metrics_batch(self.run_id, max(self.attempt, 0), rows)
        except Exception as e:
            log.warning("ledger_metrics_failed", error=str(e))

    # ================================================================== events
    def _event(self, event: str, level: str, message: str, *, ledger_only: bool = False, **data: Any) -> None:
        """Log one event line and keep it in the ledger (``ledger_only``: a part logged it already)."""
        if not ledger_only:
            getattr(log, level)(event, attempt=self.attempt if self.attempt >= 0 else None, message=message,
                                **{k: v for k, v in data.items() if v is not None})
        try:
            self.ledger.event(self.run_id, self.attempt if self.attempt >= 0 else None, event, level, message,
                              _jsonable(data) if data else None)
        except Exception as e:  # a full disk must not take the supervisor down
            log.error("ledger_write_failed", error=str(e), message="the ledger could not record an event")

    def _set_state(self, new: State, why: str) -> None:
        if new is self.state:
            return
        old = self.state
        self.state = new
        log.info("state_changed", old=old.value, new=new.value, why=why, attempt=self.attempt)

    # ================================================================== launching
    def _launch(self) -> None:
        """BACKOFF/initial -> STARTING: the gate and the checkpoint choice run on a worker thread
        (hashing and load tests take seconds) while the loop keeps answering signals, the control
        socket and the systemd watchdog; ``_spawn`` follows when they are done."""
        assert self.parts is not None
        self._set_state(State.STARTING, "launching")
        self.attempt = self.ledger.next_attempt_number(self.run_id)
        previous_pids = list(self.job.known) if self.job else []
        if self.job is not None:
            self.job.close()
            self.job = None
        action = self.pending.decision.action if self.pending.decision else Action.RESTART
        onset = self._onset_step() if self.pending.decision else None
        explicit = self.pending.explicit_checkpoint
        parts = self.parts
        fut: Future[tuple[Any, Any]] = Future()

        def prepare() -> None:
            try:
                self._env_probe()  # ~50-250 ms once per daemon life: not on the main loop
                # No progress: several failures in a row without a newer checkpoint.
                stuck = parts.before_launch(self)
                if stuck:
                    fut.set_result(({"passed": False, "no_progress": stuck}, None))
                    return
                gate = parts.gate(self, previous_pids)
                if gate is not None and not gate.get("passed", True):
                    fut.set_result((gate, None))
                    return
                fut.set_result((gate, parts.choose_checkpoint(self, action, onset, explicit)))
            except BaseException as e:
                fut.set_exception(e)
            self.q.put(("wake",))  # the loop spawns at once, not at its next tick

        self.preparing = fut
        threading.Thread(target=prepare, name="launch-prepare", daemon=True).start()

    def _spawn(self, fut: "Future[tuple[Any, Any]]") -> None:
        """STARTING (prepared) -> RUNNING, or GAVE_UP when the gate or the checkpoint choice failed."""
        assert self.parts is not None
        self.preparing = None
        try:
            gate, resume = fut.result()
        except Exception as e:
            self._event("checkpoint_selection_failed", "error", f"choosing a checkpoint failed: {e!r}; "
                        "starting without one would lose progress, so giving up")
            self._give_up(f"could not choose a checkpoint to resume from: {e}", Cause.CHECKPOINT_LOAD_ERROR)
            return
        if resume is None and gate.get("no_progress"):
            self._give_up(gate["no_progress"], Cause.NO_PROGRESS)
            return
        if resume is None:
            reasons = [str(x) for x in gate.get("reasons") or []]
            storage_only = bool(reasons) and all(x.startswith("storage probe failed") for x in reasons)
            where = "the checkpoint storage (mounts, free space, permissions)" if storage_only else \
                "the node (nvidia-smi, dmesg)"
            self._give_up(f"the pre-launch health gate failed: {gate.get('summary')}; look at {where} "
                          "before restarting", Cause.DISK_LOW if storage_only else Cause.GPU_FAULT)
            return
        self.resume = resume
        spec = self._launch_spec()
        snapshot = None  # recorded once the monitors have started (below)
        remedies = ([{"env": dict(self.remedy_env), "args": list(self.remedy_args),
                      "skip_batches": self.skip_batches}] if (self.remedy_env or self.remedy_args or self.skip_batches)
                    else [])
        self.ledger.begin_attempt(self.run_id, self.attempt, list(spec.argv), spec.cwd, redact_env(spec.added_env),
                                  snapshot, self.resume.checkpoint, self.resume.step, remedies, gate)
        self.root = None
        self.exit_seen_at = None
        self.shutdown = None
        self.failed_monitors.clear()
        self.oom_kills_before = cgroup_oom_kills()
        self.last_metric = None
        self.parts.before_spawn(self)
        try:
            self.job = JobProcess(spec, self.fanout, self.passthrough, self.cfg.log_file(),
                                  lambda src: self.q.put(("eof", src)), self.osapi)
        except OSError as e:
            self.ledger.end_attempt(self.run_id, self.attempt, exit_code=None, signal=None, cause=Cause.CRASH.value,
                                    action=Action.GIVE_UP.value, summary=f"cannot start: {e}")
            self._give_up(f"cannot start the job: {e} (argv {list(spec.argv)!r}, cwd {spec.cwd}); "
                          "fix job.command / job.workdir", Cause.CRASH)
            return
        self.attempt_started = self.clock.monotonic()
        self.attempt_started_wall = self.clock.time()
        self.ledger.set_attempt_process(self.run_id, self.attempt, self.job.pid, self.job.pgid,
                                        self.job.leader.create_time)
        nmax = self.cfg.policy.max_restarts
        resume_txt = (f"resuming from {self.resume.checkpoint} (step {self.resume.step})"
                      if self.resume.checkpoint else "fresh start (no checkpoint)")
        self._event("job_started", "info",
                    f"attempt {self.attempt} started (pid {self.job.pid}, restarts so far {len(self._counted())}/{nmax}); "
                    f"{resume_txt}", pid=self.job.pid, argv=list(spec.argv), checkpoint=self.resume.checkpoint,
                    resume_step=self.resume.step)
        ctx = AttemptContext(self.run_id, self.attempt, self.job.pgid, self.job.pid, self.attempt_started,
                             self.state_dir, self._heartbeat_dir(), self.cfg.checkpoint_dir(),
                             self.resume.checkpoint, self.resume.step)
        self.monitors = self.parts.monitors_for_attempt(self, ctx)
        for m in list(self.monitors):
            self._guard(m, "start", ctx, self.emit)
        # Now the GPU/host monitors have looked at least once: record what the attempt runs on.
        self._attempt_snapshot = self._snapshot(spec)
        self.ledger.update_attempt(self.run_id, self.attempt, snapshot_json=self._attempt_snapshot)
        self.pending = Pending()
        self.parts.attempt_started(self, ctx)

    def _heartbeat_dir(self) -> Path:
        # One folder per attempt: a heartbeat or metric line the previous attempt wrote while
        # it was being stopped can never be mistaken for the new attempt's.
        return self.state_dir / "heartbeats" / f"attempt-{self.attempt}"

    def _launch_spec(self) -> LaunchSpec:
        cfg = self.cfg
        if cfg.job.shell:
            argv = ["/bin/sh", "-c", " ".join([cfg.job.command[0], *self._extra_args()])]
        else:
            argv = merge_args(list(cfg.job.command), self.remedy_args)
            argv += self._resume_args()
        hb = self._heartbeat_dir()
        hb.mkdir(parents=True, exist_ok=True)
        assert self.parts is not None
        added: dict[str, str] = dict(self.parts.job_env(self))
        added.update(cfg.job.env)
        added.update(self.remedy_env)
        if self.diagnostics:
            added.update(cfg.validation.diagnostics_env)
        ckdir = cfg.checkpoint_dir()
        added.update({
            "TSUP_RUN_ID": self.run_id,
            "TSUP_ATTEMPT": str(self.attempt),
            "TSUP_RESUME_FROM": self.resume.checkpoint or "",
            "TSUP_RESUME_STEP": "" if self.resume.step is None else str(self.resume.step),
            "TSUP_SKIP_BATCHES": str(self.skip_batches) if self.resume.checkpoint else "0",
            "TSUP_HEARTBEAT_DIR": str(hb),
            "TSUP_CHECKPOINT_DIR": str(ckdir) if ckdir else "",
            "TSUP_STATE_DIR": str(self.state_dir),
            "TSUP_STOP_SIGNAL": cfg.shutdown.stop_signal,
            "TSUP_CHECKPOINT_SIGNAL": cfg.shutdown.checkpoint_signal,
        })
        base = {k: v for k, v in os.environ.items() if k not in _STRIP_ENV} if cfg.job.inherit_env else {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        if cfg.job.unbuffered and not base.get("PYTHONUNBUFFERED") and "PYTHONUNBUFFERED" not in added:
            # Python block-buffers stdout into a pipe: without this a NaN line printed at step
            # 60 reaches the detectors minutes later, or only when the job exits.
            added["PYTHONUNBUFFERED"] = "1"
        env = {**base, **added}
        return LaunchSpec(tuple(argv), str(cfg.workdir()), env, added)

    def _resume_args(self) -> list[str]:
        if not self.resume.checkpoint:
            return []
        return [a.replace("{checkpoint}", self.resume.checkpoint) for a in self.cfg.job.resume_args]

    def _extra_args(self) -> list[str]:
        import shlex

        return [shlex.quote(a) for a in [*self.remedy_args, *self._resume_args()]]

    def _env_probe(self) -> None:
        """Library versions of the job's Python, git state, host: once per daemon life."""
        if self.snapshot_cache is None:
            py = job_python(self.cfg.job.command, self.cfg.job.python)
            try:
                self.snapshot_cache = snapshot(py, self.cfg.workdir(), self.cfg.job.command,
                                               {**os.environ, **self.cfg.job.env})
            except Exception as e:
                self.snapshot_cache = {"error": repr(e)}

    def _snapshot(self, spec: LaunchSpec) -> dict[str, Any]:
        self._env_probe()
        assert self.parts is not None
        world = {"world": world_from_launch(spec.argv, spec.env)}
        return {**(self.snapshot_cache or {}), **world, **self.parts.snapshot_extra(self)}

    # ================================================================== detections
    def _on_detection(self, d: Detection) -> None:
        if self.job is None or self.state not in (State.STARTING, State.RUNNING, State.STOPPING):
            return
        self.last_anomaly = d
        data = detection_dict(d)
        if self.root is not None or self.state is State.STOPPING:
            self._event("detection_noted", "info", f"also seen while stopping: {d.summary}", **data)
            return
        ran = self.clock.monotonic() - self.attempt_started
        decision = decide(self.cfg, self._past(), Failure(d.cause, d.summary, d.suggested_action, d.step,
                                                         d.onset_step),
                          now=self.clock.time(), ran_s=ran, jitter_draw=self.rng.uniform(-1, 1))
        if decision.action is Action.WARN:
            self._event("detection_warned", "warning", f"{d.summary} (from {d.source}); {decision.reason}", **data)
            return
        self.root = d
        self.ledger.update_attempt(self.run_id, self.attempt, detection_json=data)
        self._event("failure_detected", "warning",
                    f"attempt {self.attempt} failing: {d.cause.value}"
                    + (f" at step {d.step}" if d.step is not None else "") + f": {d.summary}; "
                    + self._what_next(decision), cause=d.cause.value, step=d.step, onset_step=d.onset_step,
                    evidence=d.evidence, source=d.source, action=decision.action.value)
        self.pending.decision = decision
        self._begin_stop(self._plan_for(d.cause, decision), now=self.clock.monotonic())

    def _what_next(self, decision: Decision) -> str:
        if decision.action is Action.GIVE_UP:
            return f"giving up after stopping the job ({decision.reason})"
        return (f"stopping the job, then {decision.action.value} in {decision.delay_s:.1f} s "
                f"(restart {decision.restarts_in_window}/{decision.max_restarts}; {decision.reason})")

    def _plan_for(self, cause: Cause | None, decision: Decision | None) -> ShutdownPlan:
        s = self.cfg.shutdown
        mode = Mode(s.mode)
        grace = s.grace_s
        if cause is Cause.HANG:
            mode, grace = Mode.GRACEFUL, s.hang_grace_s  # a hung job flushes nothing: short grace
        if mode is Mode.HYBRID and decision is not None and decision.action in (Action.ROLLBACK, Action.GIVE_UP):
            mode = Mode.GRACEFUL  # an emergency checkpoint of a diverged model is worthless
        return ShutdownPlan(mode, grace, signal_number(s.stop_signal), signal_number(s.checkpoint_signal),
                            s.checkpoint_timeout_s, reason=cause.value if cause else "stop")

    def _begin_stop(self, plan: ShutdownPlan, now: float) -> None:
        """RUNNING/STARTING -> STOPPING."""
        assert self.job is not None and self.parts is not None
        if self.root is not None and self.root.cause is Cause.HANG:
            self.parts.dump_stacks(self, self.job.pids())
        for m in self.monitors:
            self._guard(m, "stop")
        self.monitors = []
        self._set_state(State.STOPPING, plan.reason)
        self.shutdown = Shutdown(plan, self.job, now, self.parts.new_checkpoint_probe(self, now),
                                 self.parts.extend_timeout)

    # ================================================================== job exit
    def _check_job_exit(self, now: float) -> None:
        assert self.job is not None
        if self.state is State.STOPPING:
            self.job.poll()
            return
        if self.job.poll() is None:
            return
        if self.exit_seen_at is None:
            self.exit_seen_at = now
        # Give the pumps a moment: the line that explains the exit (an OOM traceback) is often
        # the last one written, and its detection must be the root cause, not "crash".
        if not self._job_output_done(now):
            return
        self._drain_queue()
        if self.state is State.STOPPING:  # a detection arrived and started a stop
            return
        status = self.job.status
        assert status is not None
        info = classify_exit(status, list(self.job.known), self.oom_kills_before)
        if info.cause is None:
            self.pending.decision = None
            self.pending.exit_after = True
            self._finish_attempt(info, now, success=True)
            return
        d = Detection(info.cause, info.summary, "exit", value=float(info.exit_code) if info.exit_code is not None
                      else None, evidence=info.oom_evidence,
                      step=self.last_metric.step if self.last_metric else None)
        self.root = d
        ran = now - self.attempt_started
        decision = decide(self.cfg, self._past(), Failure(d.cause, d.summary), now=self.clock.time(), ran_s=ran,
                          jitter_draw=self.rng.uniform(-1, 1))
        if decision.action is Action.WARN:  # a crash cannot be "warned": the job is gone
            decision = Decision(Action.GIVE_UP, d.cause, f"[on.{d.cause.value}] action = warn, but the job exited; "
                                                          "nothing left to supervise")
        self.pending.decision = decision
        self._finish_attempt(info, now, success=False)

    def _job_output_done(self, now: float) -> bool:
        assert self.job is not None
        if self.exit_seen_at is None:
            self.exit_seen_at = now
        return self.job.pumps_done(0) or now - self.exit_seen_at >= EXIT_DRAIN_S

    def _finish_attempt(self, info: ExitInfo, now: float, success: bool) -> None:
        """The leader exited by itself: stop what is left of the group, then decide."""
        assert self.job is not None
        if self.job.group_alive():
            plan = ShutdownPlan(Mode.GRACEFUL, self.cfg.shutdown.leftover_grace_s,
                                signal_number(self.cfg.shutdown.stop_signal), reason="leftovers")
            self._event("job_leftovers", "warning",
                        f"the job's main process ended ({info.summary}) but processes of its group remain; "
                        f"stopping them (SIGKILL after {plan.grace_s:g} s)")
            for m in self.monitors:
                self._guard(m, "stop")
            self.monitors = []
            self._set_state(State.STOPPING, "leftovers")
            self.shutdown = Shutdown(plan, self.job, now)
            return
        self._after_stop(now)

    def _after_stop(self, now: float) -> None:
        """STOPPING (or a job that exited) -> BACKOFF | STOPPED | FINISHED | GAVE_UP."""
        assert self.job is not None and self.parts is not None
        self.job.poll()
        for m in self.monitors:
            self._guard(m, "stop")
        self.monitors = []
        status = self.job.status
        info = classify_exit(status, [], None) if status is not None else ExitInfo(None, None, Cause.CRASH,
                                                                                    "not reaped")
        ran = now - self.attempt_started
        shutdown = self.shutdown.result(now) if self.shutdown else None
        decision = self.pending.decision
        cause = self.root.cause if self.root else None
        # The verdict of a validation in progress, the checkpoint bookkeeping, goodput.
        self.parts.attempt_ended(self, cause, decision)
        try:  # the state at the failure (metrics, heartbeats, GPU/host), beside the state at launch
            at_end = dict(self.parts.snapshot_extra(self))
            at_end["last_metric"] = _metric_json(self.last_metric) if self.last_metric else None
            at_end["heartbeats"] = self._status_cache.get("heartbeats")
            if at_end:
                self.ledger.update_attempt(self.run_id, self.attempt,
                                           snapshot_json={**(self._attempt_snapshot or {}), "at_end": at_end})
        except Exception as e:
            log.warning("snapshot_failed", error=repr(e))
        counted = cause is not None and cause is not Cause.MANUAL
        summary = (self.root.summary if self.root else info.summary)
        action = decision.action.value if decision else None
        if self.pending.exit_after and decision is None:
            action = None
        self.ledger.end_attempt(
            self.run_id, self.attempt, exit_code=info.exit_code, signal=info.signal,
            cause=cause.value if cause else None, action=action, summary=summary, counted=counted,
            detection=detection_dict(self.root) if self.root else None,
            decision=_jsonable(decision) if decision else None,
            shutdown=_jsonable(shutdown) if shutdown else None)
        self.history.append(PastAttempt(self.attempt, cause, self.clock.time(), ran, counted))
        if cause is not None:
            self.restarts_by_cause[cause.value] += 1
        self.shutdown = None
        self.job.close()

        if self.pending.exit_after:
            if cause is None and not self.stop_requests and info.exit_code == 0:
                self._finish(State.FINISHED, EXIT_OK, f"the job finished successfully after {ran:.1f} s "
                                                      f"(attempt {self.attempt})")
            else:
                self._finish(State.STOPPED, EXIT_OK, "stopped on request after a graceful stop of the job"
                             + (" (escalated to SIGKILL)" if shutdown and shutdown.escalated else ""))
            return
        if decision is None:
            decision = Decision(Action.GIVE_UP, cause or Cause.CRASH, "no decision recorded")
        if not decision.relaunch:
            self._give_up(f"attempt {self.attempt} failed: {summary}; {decision.reason}", decision.cause)
            return
        self._apply_remedies(decision)
        if decision.cause is Cause.VALIDATION_FAILED:
            self.diagnostics = True
        # From a fresh clock: the bookkeeping above may have taken a moment.
        self.backoff_until = self.clock.monotonic() + decision.delay_s
        self._set_state(State.BACKOFF, decision.cause.value)
        self._event("restart_scheduled", "warning",
                    f"attempt {self.attempt} failed: {decision.cause.value} ({summary}) after {ran:.1f} s; "
                    f"{decision.action.value} {decision.restarts_in_window}/{decision.max_restarts} "
                    f"in {decision.delay_s:.1f} s", cause=decision.cause.value, action=decision.action.value,
                    delay_s=round(decision.delay_s, 3), remedies=decision.remedies.as_json() or None)
        self.pending = Pending(decision=decision, explicit_checkpoint=self.pending.explicit_checkpoint)

    def _apply_remedies(self, decision: Decision) -> None:
        r = decision.remedies
        if r.rungs:
            self.remedy_env.update(r.env)
            self.remedy_args = merge_args(self.remedy_args, r.args)
            self.skip_batches = max(self.skip_batches, r.skip_batches)
            self._event("remedies_applied", "warning",
                        f"{decision.cause.value} repeated: applying remedies {list(r.rungs)} of "
                        f"[on.{decision.cause.value}] to the next attempts", env=dict(r.env), args=list(r.args),
                        skip_batches=r.skip_batches)

    def _onset_step(self) -> int | None:
        d = self.root or self.last_anomaly
        if d is None:
            return None
        return d.onset_step if d.onset_step is not None else d.step

    def _past(self) -> list[PastAttempt]:
        return list(self.history)

    def _counted(self) -> list[PastAttempt]:
        return [p for p in self.history if p.counted and p.cause is not None]

    def _give_up(self, reason: str, cause: Cause) -> None:
        self._set_state(State.GAVE_UP, cause.value)
        self._event("gave_up", "critical", f"gave up: {reason}. The job is not restarted; a human should "
                                           f"look at the journal, `transformer-supervisor history` and the "
                                           f"state dir {self.state_dir}", cause=cause.value)
        self._finish(State.GAVE_UP, EXIT_GAVE_UP, reason)

    def _finish(self, state: State, code: int, reason: str) -> None:
        self._set_state(state, reason)
        if state is not State.GAVE_UP:
            self._event("daemon_exiting", "info", reason, exit_code=code)
        self.ledger.end_run(self.run_id, state.value, code, reason)
        self.exit_reason = reason
        self.exit_code = code

    # ================================================================== requests
    def request_stop(self, escalate_on_repeat: bool = True) -> None:
        self.stop_requests += 1
        now = self.clock.monotonic()
        if self.state is State.BACKOFF or self.preparing is not None or (
                self.job is None and self.state is State.STARTING):
            self.preparing = None
            self._finish(State.STOPPED, EXIT_OK, "stopped on request while waiting to restart")
            return
        if self.state is State.STOPPING:
            self.pending.exit_after = True
            self.pending.decision = None
            if escalate_on_repeat and self.stop_requests > 1 and self.shutdown is not None:
                self.shutdown.escalate(now)
            return
        if self.state in (State.STARTING, State.RUNNING):
            self._event("stop_requested", "info",
                        f"stop requested; stopping the job ({self.cfg.shutdown.mode}, grace "
                        f"{self.cfg.shutdown.grace_s:g} s), then the daemon exits 0")
            self.pending = Pending(exit_after=True)
            self._begin_stop(self._plan_for(None, None), now)

    def request_restart(self, reason: str, checkpoint: str | None, rollback: bool) -> dict[str, Any]:
        if self.state not in (State.STARTING, State.RUNNING, State.BACKOFF) or (
                self.state is State.STARTING and self.job is None):
            raise RuntimeError(f"cannot restart while {self.state.value}"
                               + (" (a launch is being prepared)" if self.preparing is not None else ""))
        action = Action.ROLLBACK if rollback else Action.RESTART
        d = Detection(Cause.MANUAL, f"operator restart: {reason}", "control")
        decision = Decision(action, Cause.MANUAL, f"operator request ({reason})")
        if self.state is State.BACKOFF:
            self.pending = Pending(decision=decision, explicit_checkpoint=checkpoint)
            self.backoff_until = self.clock.monotonic()
            return {"accepted": True, "message": "restarting now (was waiting in backoff)"}
        self.root = d
        self.pending = Pending(decision=decision, explicit_checkpoint=checkpoint)
        self._event("restart_requested", "warning", f"operator restart ({reason}); stopping the job, then "
                    f"{action.value}" + (f" from {checkpoint}" if checkpoint else ""), cause="manual")
        self._begin_stop(self._plan_for(Cause.MANUAL, decision), self.clock.monotonic())
        return {"accepted": True, "message": f"stopping the job, then {action.value}"}

    def request_checkpoint(self) -> dict[str, Any]:
        if self.job is None or self.state not in (State.STARTING, State.RUNNING):
            raise RuntimeError(f"no running job (state {self.state.value})")
        sig = signal_number(self.cfg.shutdown.checkpoint_signal)
        self.job.signal_group(sig)
        self._event("checkpoint_requested", "info",
                    f"sent {self.cfg.shutdown.checkpoint_signal} to the job: it should write a checkpoint "
                    "at its next step boundary and keep training")
        return {"signal": self.cfg.shutdown.checkpoint_signal, "pgid": self.job.pgid}

    def reload(self) -> dict[str, Any]:
        assert self.parts is not None
        self.parts.reloading(self)
        if self.config_path is None:
            self._event("reload_ignored", "warning", "reload requested but the daemon runs without a config file "
                        "(wrap with flags only); nothing to reload")
            return {"reloaded": False, "reason": "no config file"}
        try:
            new = load_config(self.config_path)
        except ConfigError as e:
            self._event("reload_rejected", "error",
                        f"reload of {self.config_path} rejected, keeping the running config: "
                        + "; ".join(str(p) for p in e.problems), problems=[str(p) for p in e.problems])
            self.parts.reloaded(self)
            return {"reloaded": False, "problems": [str(p) for p in e.problems]}
        changed = configschema.diff(self.cfg, new)
        if new.state_dir().resolve() != self.state_dir:
            changed.pop("state.dir", None)
            self._event("reload_partial", "warning", "state.dir cannot change while running; restart the daemon")
            new = new.__class__(**{**{f: getattr(new, f) for f in new.__dataclass_fields__},
                                   "state": self.cfg.state})
        # Sections read once at daemon start (monitors, services, listeners) need a restart.
        later = sorted(k for k in changed if k.split(".", 1)[0] in RESTART_SECTIONS)
        if later:
            self._event("reload_needs_restart", "warning",
                        f"{len(later)} changed key(s) take effect only after a daemon restart: {', '.join(later)}",
                        keys=later)
        self.cfg = new
        self._event("config_reloaded", "info",
                    f"config reloaded from {self.config_path}: {len(changed)} key(s) changed"
                    + (f" ({', '.join(sorted(changed))})" if changed else "")
                    + "; applied at the next launch",
                    changed={k: (["<redacted>", "<redacted>"] if is_secret(k.rsplit(".", 1)[-1]) else [str(a), str(b)])
                             for k, (a, b) in changed.items()})
        self.parts.reloaded(self)
        return {"reloaded": True, "changed": sorted(changed)}

    def _on_signal(self, sig: int) -> None:
        if sig == signal.SIGCHLD:
            return  # wakes the loop; _tick reaps
        if sig in (signal.SIGTERM, signal.SIGINT):
            self._event("signal_received", "info", f"received {signal.Signals(sig).name}"
                        + ("; stopping the job gracefully" if self.stop_requests == 0 else "; escalating to SIGKILL"))
            self.request_stop()
        elif sig == signal.SIGHUP:
            self.reload()

    def _on_control(self, verb: str, args: Mapping[str, Any]) -> Any:
        if verb == "status":
            return self.status()
        if verb == "stop":
            self.request_stop()
            return {"accepted": True, "message": "stopping the job gracefully, then the daemon exits 0"}
        if verb == "restart":
            return self.request_restart(str(args.get("reason") or "operator request"), args.get("from"),
                                        bool(args.get("rollback")))
        if verb == "checkpoint-now":
            return self.request_checkpoint()
        if verb == "reload":
            return self.reload()
        raise KeyError(verb)

    def control(self, verb: str, args: Mapping[str, Any], timeout: float = 20.0) -> Any:
        """Called from the control server's threads: hand over to the main loop, wait for it."""
        if verb == "status":
            return self._status_cache or self.status()
        from .ops.control import ControlError

        fut: Future[Any] = Future()
        self.q.put(("control", verb, dict(args), fut))
        try:
            return fut.result(timeout=timeout)
        except RuntimeError as e:
            raise ControlError("conflict", str(e)) from None
        except KeyError:
            raise ControlError("unknown_verb", f"unknown verb {verb!r}; known: status, restart, stop, "
                                               "checkpoint-now, reload") from None
        except TimeoutError:
            raise ControlError("timeout", f"the daemon's main loop did not answer {verb!r} within "
                                          f"{timeout:g} s") from None

    # ================================================================== previous life
    def _adopt_previous_life(self) -> None:
        """After a daemon crash (kill -9, watchdog): stop a job group left from the previous life
        (matched by pid AND start time, never a reused pid), close its attempt, keep the budget."""
        rows = self.ledger.attempts(self.run_id)
        for r in rows:
            if r.ended_at is None:
                stopped = self._stop_leftover(r)
                self.ledger.end_attempt(self.run_id, r.attempt, exit_code=None, signal=None, cause=None, action=None,
                                        summary="the daemon was restarted while this attempt ran"
                                                + ("; its leftover job group was stopped" if stopped else ""),
                                        counted=False)
                self._event("previous_attempt_closed", "warning",
                            f"attempt {r.attempt} was running when the previous daemon died; "
                            + ("its job group was still alive and has been stopped" if stopped
                               else "its job is already gone") + "; continuing the same run")
        for r in self.ledger.attempts(self.run_id):
            if r.ended_at is not None:
                cause = Cause(r.cause) if r.cause in {c.value for c in Cause} else None
                self.history.append(PastAttempt(r.attempt, cause, r.ended_at,
                                                r.ended_at - r.started_at, r.counted))
                if cause is not None:
                    self.restarts_by_cause[cause.value] += 1

    def _stop_leftover(self, r: Any) -> bool:
        if r.pgid is None:
            return False
        leader = ProcRef(r.pid, r.leader_ctime or 0.0) if r.pid else None
        members = [p for p in self.osapi.group_members(r.pgid) if self._started_after(p, r.started_at - 5)]
        if not members and not (leader and leader.alive()):
            return False
        # A real job group from our previous life: SIGTERM, short grace, SIGKILL.
        for sig, wait in ((signal.SIGTERM, self.cfg.shutdown.leftover_grace_s), (signal.SIGKILL, 10.0)):
            self.osapi.killpg(r.pgid, sig)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                if not [p for p in self.osapi.group_members(r.pgid) if self._started_after(p, r.started_at - 5)]:
                    return True
                time.sleep(0.05)
        return True

    @staticmethod
    def _started_after(pid: int, t: float) -> bool:
        import psutil

        try:
            return psutil.Process(pid).create_time() >= t
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False

    # ================================================================== status
    def status(self) -> dict[str, Any]:
        assert self.parts is not None
        lm = self.last_metric
        st: dict[str, Any] = {
            "state": self.state.value,
            "run_id": self.run_id,
            "name": self.cfg.job.name,
            "attempt": max(self.attempt, 0),
            "pids": self.job.pids() if self.job is not None and self.state in (
                State.STARTING, State.RUNNING, State.STOPPING) else [],
            "restarts_by_cause": dict(self.restarts_by_cause),
            "last_metric": _metric_json(lm) if lm else None,
            "heartbeats": {},
            "gpus": None,
            "checkpoint": self.resume.checkpoint,
            "goodput": None,
            "last_anomaly": detection_dict(self.last_anomaly) if self.last_anomaly else None,
            "remedies": {"env": dict(self.remedy_env), "args": list(self.remedy_args),
                         "skip_batches": self.skip_batches},
            "max_restarts": self.cfg.policy.max_restarts,
            "state_dir": str(self.state_dir),
            "daemon_pid": os.getpid(),
        }
        if self.state is State.BACKOFF:
            st["restart_in_s"] = round(max(0.0, self.backoff_until - self.clock.monotonic()), 3)
        st.update(self.parts.status_extra(self))
        return st

    def refresh_status_cache(self) -> dict[str, Any]:
        self._status_cache = self.status()
        return self._status_cache


def _metric_json(m: MetricRecord) -> dict[str, Any]:
    """``status --json`` last_metric: the watcher's shape plus how old it is."""
    return {**metric_dict(m), "age_s": round(time.time() - m.at, 3)}
