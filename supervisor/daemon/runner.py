"""The runner: the loop that feeds events to the state machine and carries out its commands.

Monitors observe and put typed messages in one inbox; signal handlers only record; the loop takes
them in order, hands each to :class:`~supervisor.core.machine.Machine` (which decides, with the
pure policy) and carries out the commands it returns through the ports: the only place that acts.
States and moves: :mod:`supervisor.core.machine`; put together by :func:`supervisor.daemon.wiring.build_daemon`.
"""

from __future__ import annotations

import os
import random
import signal
import threading
from concurrent.futures import Future
from typing import Any, Mapping, Sequence, assert_never

import structlog

from ..config.model import Config, ConfigSource
from ..core.machine import JOB_UP, Machine, State
from ..core.messages import (EXIT_GAVE_UP, Activity, ArmTimer, Boot, Command, Detected, EndAttempt,
                            EscalateStop, Event, Finish, FirstMetric, JobExited, Launch, PrepareLaunch, Prepared,
                            Record, RecordDetection, Reply, SignalJob, Spawned, SpawnFailed, CheckEnd, EndChecked,
                            StateChanged, StopJob, StopRequested, TimerFired, detection_dict)
from ..job.launch import config_json, drop_heartbeat_dir_if_empty
from .activity import AttemptActivity
from .attemptstart import AttemptStarter, prepare_launch
from .effects import AttemptField, AttemptWriter, Carrier, Detect, Effect, Note
from .inbox import ControlAsked, DetectionArrived, EffectHanded, Inbox, Message, PipeEnded, SignalArrived, WakeUp
from .jobstop import JobStop
from .metricbuffer import MetricBuffer
from .monitors import AttemptMonitors
from .plugin import AttemptEnded, ConcernSet, DaemonStarted, JobHung, MetricsBatch, Plugin, RunView, Tick
from .ports import Job, Ports
from .recovery import close_previous_life
from .reload import reload_config
from .ckptsignal import refuse_checkpoint, send_checkpoint_signal
from .requests import RUNNER_VERBS, answer, ask, go_on, install_signal_handlers, machine_request
from .recorder import EventRecorder, Snapshots, end_row, log_helper
from .status import StatusCache, booting_status, status_dict
from ..core.observations import Detection, MetricRecord
from ..job.output import SinkFanout

log = structlog.get_logger("supervisor.daemon.runner")

TICK_S = 0.1
# A job that ends at once (a typo in its command) can end the daemon before the environment probe
# comes back: its rows are completed if the probe answers within this, else left without it.
PROBE_WAIT_AT_EXIT_S = 3.0


class Runner:
    def __init__(self, cfg: Config, ports: Ports, concerns: Sequence[Plugin], *, fanout: SinkFanout,
                 config: ConfigSource | None = None, rng: random.Random | None = None, tick_s: float = TICK_S) -> None:
        self.cfg = cfg
        self.tick_s = tick_s  # the longest wait for an event before the loop ticks
        self.config_source = config  # what a reload reads again
        self.ports = ports
        self.clock = ports.clock
        self.ledger = ports.ledger
        self.concerns = ConcernSet(concerns, self.run_view, self.apply)
        self.fanout = fanout
        self.rng = rng or random.Random()
        self.inbox = Inbox()
        self.state_dir = cfg.state_dir().resolve()
        self.machine = Machine(cfg, self.state_dir)
        self.run_id = ""
        self.job: Job | None = None
        self.monitors = AttemptMonitors(self.event)
        self.jobstop = JobStop(self.monitors)
        self.preparing: Future[Prepared] | None = None
        self.timer_at: float | None = None  # when TimerFired is due (monotonic)
        self.metrics = MetricBuffer()
        self.writes = AttemptWriter(self.ledger, lambda: self.run_id)
        self.loop_thread = threading.get_ident()  # the main loop's (set again when it starts)
        self._view: RunView | None = None  # the turn's view, built at its first reader
        self.snapshots = Snapshots(self.writes.write, ports.environment)
        self.activity = AttemptActivity(self.clock.monotonic)  # a blind attempt's work (the progress rule)
        fanout.add(self.activity)
        self.starter = AttemptStarter(ports, self.concerns, self.monitors, self.snapshots, self.activity,
                                      self.state_dir, on_eof=lambda src: self.inbox.put(PipeEnded(src)))
        self.status_cache = StatusCache(self.status, self.concerns.live_statuses,
                                        lambda: booting_status(self.attempt, self.cfg, self.state_dir, self.run_id))
        self.recorder = EventRecorder(self.ledger, self.concerns, lambda: (self.run_id, self.attempt), self.clock)
        self.carry_out = Carrier(lambda n: self.recorder.event(n.event, n.level, n.message, code_site=n.site,
                                                               ledger_only=n.ledger_only, **n.data),
                                 self.emit, self.writes.write, lambda: self.inbox.put(ControlAsked("checkpoint-now", {})),
                                 self.use_config, self.refresh_status_cache)  # checkpoint-now: nobody waits

    # ================================================================== what plug-ins see
    @property
    def attempt(self) -> int:
        return self.machine.attempt

    @property
    def state(self) -> State:
        return self.machine.state

    @property
    def exit_code(self) -> int | None:
        return self.machine.exit_code

    def run_view(self) -> RunView:
        """The turn's view: built once, again only after the machine moved or the config changed."""
        if self._view is None:
            m = self.machine
            self._view = RunView(self.cfg, self.run_id, self.state_dir, m.state, m.attempt, self.job is not None, m.root,
                                 m.pending.decision, m.resume, self.metrics.last, m.exit_code, m.exit_reason,
                                 self.clock.monotonic(), self.clock.time())
        return self._view

    def apply(self, effect: Effect) -> None:
        """Carry out a plug-in's effect; from another thread it is a message the loop carries out."""
        if threading.get_ident() != self.loop_thread:
            return self.inbox.put(EffectHanded(effect))
        self.carry_out(effect)

    @property
    def metric_history(self) -> Sequence[MetricRecord]:
        return self.metrics.history

    def emit(self, d: Detection) -> None:  # from any thread: the monitors'
        self.inbox.put(DetectionArrived(d))

    def on_metric(self, rec: MetricRecord) -> None:  # from any thread: the parsers', the client metrics reader's
        self.metrics.put(rec)

    @log_helper  # (one event line, kept in the ledger)
    def event(self, event: str, level: str, message: str, *, ledger_only: bool = False, **data: Any) -> None:
        self.recorder.event(event, level, message, ledger_only=ledger_only, **data)

    # ================================================================== life cycle
    def run(self) -> int:
        """The daemon's life: start, loop until the machine finishes, close; the exit code."""
        install_signal_handlers(self.inbox)
        if not self.start():
            return EXIT_GAVE_UP
        try:
            while self.exit_code is None:
                self.step()
        finally:
            self.close()
        assert self.exit_code is not None
        return self.exit_code

    def start(self) -> bool:
        """Open the run, start the concerns, close what a previous daemon left, launch. False
        when a concern cannot start (the run is then ended as given up)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.loop_thread = threading.get_ident()
        self.run_id, continued = self.ledger.open_run(self.cfg.job.name, config_json(self.cfg))
        structlog.contextvars.bind_contextvars(run_id=self.run_id)
        try:
            self.concerns.start(DaemonStarted(self.ledger, self.status_cache.answer, self.refresh_status_cache,
                                            self.control, self.apply, self.on_metric))  # a failure: the started kept
        except Exception as e:
            self.event("daemon_start_failed", "error", f"cannot start: {e}")
            self.ledger.end_run(self.run_id, State.GAVE_UP.value, EXIT_GAVE_UP, str(e))
            self.close()
            return False
        self.event("daemon_started", "info",
                   f"supervising run {self.run_id} ({'continuing after a daemon restart' if continued else 'new run'}); "
                   f"state dir {self.state_dir}", continued=continued, pid=os.getpid())
        history = close_previous_life(self.ledger, self.run_id, self.cfg, self.ports.osapi, self.clock,
                                      self.event) if continued else []
        self._feed(Boot(self.ledger.next_attempt_number(self.run_id), history))
        return True

    def step(self) -> None:
        """One turn of the loop: wait for an event (at most a tick), handle what is queued, tick."""
        self._view = None
        self._wait_and_handle()
        self._tick()

    def close(self) -> None:
        self.monitors.stop()
        self.snapshots.complete(wait=PROBE_WAIT_AT_EXIT_S)
        if self.job is not None:
            self.job.close()
        self.ports.notifier.stopping()
        self.concerns.close()
        for m in self.inbox.take_all():  # what verifier threads handed over before they were stopped
            if isinstance(m, EffectHanded) and isinstance(m.effect, (AttemptField, Note)):
                self.apply(m.effect)
        self.ports.launcher.close()
        self.ledger.close()

    # ================================================================== the loop
    def _wait_and_handle(self) -> None:
        timeout = self.tick_s
        if self.metrics.waiting:
            timeout = 0.0  # a burst is still being kept: do not sleep on it, but serve requests between chunks
        if self.timer_at is not None:
            timeout = min(timeout, max(0.0, self.timer_at - self.clock.monotonic()))
        if (m := self.inbox.get(timeout=max(0.001, timeout))) is not None:
            self._handle(m)
            self._drain_queue()

    def _state_now(self) -> State:
        """The state now: a call mypy does not narrow across (the queue's events move the machine)."""
        return self.state

    def _drain_queue(self) -> bool:
        """Handle what is queued, without waiting (bounded: a flood cannot starve the tick); True if emptied."""
        for _ in range(1000):
            if (m := self.inbox.get()) is None:
                return True
            self._handle(m)
        return False

    def _handle(self, m: Message) -> None:
        try:
            match m:
                case SignalArrived(number):
                    self._on_signal(number)
                case DetectionArrived(d) | EffectHanded(Detect(d)):  # a reader's: fed now, like a monitor's
                    self._feed(Detected(d, self.clock.monotonic(), self.clock.time(), self.rng.uniform(-1, 1),
                                        activity=self._activity()))
                case ControlAsked(verb, args):
                    answer(m, lambda: self._on_control(verb, args))
                case EffectHanded(effect):
                    self.apply(effect)
                case PipeEnded() | WakeUp():  # they only wake the loop; the tick acts
                    pass
                case _:
                    assert_never(m)
        except Exception as e:  # the daemon must survive its own bugs
            log.exception("runner_handler_failed", item=type(m).__name__, error=repr(e),
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
        if self.job is not None and self.state in JOB_UP:
            self.job.refresh_tree(now)
            self.job.reap_orphans()
            self.monitors.poll(now)
            self._check_job_exit(now)
        if self.state is State.STOPPING and self.job is not None:
            finished = self.jobstop.finished(self.job, now, self.clock, self.ports)
            if finished is not None:
                self._feed(finished)
        if self.timer_at is not None and now >= self.timer_at:
            self.timer_at = None
            self._feed(TimerFired())
        if self.preparing is not None and self.preparing.done() and self.exit_code is None:
            prepared, self.preparing = self.preparing.result(), None
            self._feed(prepared)
        self.snapshots.complete()
        self.concerns.tick(Tick(now))
        self.ports.notifier.watchdog()

    # ================================================================== the machine
    def _feed(self, ev: Event) -> Any:
        """One event through the machine; its commands carried out in order; the reply, if any."""
        reply, moved = None, False
        for cmd in self.machine.handle(ev):
            if isinstance(cmd, Reply):
                reply = dict(cmd.result)
            else:
                moved = moved or isinstance(cmd, (StateChanged, EndAttempt))
                self._carry_out(cmd)
        if moved:
            self._view = None
            self.status_cache.refresh_if_used()
        return reply

    def _carry_out(self, cmd: Command) -> None:
        if isinstance(cmd, Record):
            self.recorder.record(cmd)
        elif isinstance(cmd, StateChanged):
            log.info("state_changed", old=cmd.old, new=cmd.new, why=cmd.why, attempt=cmd.attempt)
        elif isinstance(cmd, RecordDetection):
            self.apply(AttemptField(cmd.attempt, detection=detection_dict(cmd.detection)))
        elif isinstance(cmd, PrepareLaunch):
            self._prepare(cmd)
        elif isinstance(cmd, Launch):
            self._spawn(cmd)
        elif isinstance(cmd, StopJob):
            self._stop(cmd)
        elif isinstance(cmd, EscalateStop):
            self.jobstop.escalate(self.clock.monotonic())
        elif isinstance(cmd, SignalJob):
            if self.job is not None:
                send_checkpoint_signal(self.job, cmd.signal)  # SignalJob: only checkpoint-now's
        elif isinstance(cmd, ArmTimer):
            self.timer_at = self.clock.monotonic() + cmd.delay_s  # from a fresh clock: bookkeeping takes time
        elif isinstance(cmd, EndAttempt):
            self._end_attempt(cmd)
        elif isinstance(cmd, CheckEnd):  # the end's facts, on the loop (the watchdog fed, a stop heard)
            self._feed(EndChecked(self.concerns.end_facts(go_on(self.inbox, self.ports.notifier)), cmd))
        elif isinstance(cmd, Finish):
            self.preparing = self.timer_at = None
            self.ledger.end_run(self.run_id, cmd.state, cmd.code, cmd.reason)

    # ================================================================== launching
    def _prepare(self, cmd: PrepareLaunch) -> None:
        previous_pids = list(self.job.known) if self.job else []
        if self.job is not None:
            self.job.close()
            self.job = None
        self.preparing = prepare_launch(cmd, self.ports, self.cfg, previous_pids, list(self.metrics.history),
                                        wake=lambda: self.inbox.put(WakeUp()), hand=self.apply)

    def _spawn(self, cmd: Launch) -> None:
        self.jobstop.reset()
        self.metrics.last = None
        spawned = self.starter.spawn(self.cfg, cmd, self.run_id)
        if spawned.error is not None:
            self._feed(SpawnFailed(spawned.error, spawned.spec.argv, spawned.spec.cwd))
            return
        self.job = job = spawned.job
        assert job is not None
        self._feed(Spawned(job.pid, job.pgid, spawned.spec.argv, spawned.now))
        self.starter.started(self.cfg, cmd, self.run_id, spawned, self.emit, tuple(self.metrics.history))

    # ================================================================== stopping
    def _stop(self, cmd: StopJob) -> None:
        """Stop the monitors and start the timed stop of the job (polled by the tick)."""
        assert self.job is not None
        now = self.clock.monotonic()
        if cmd.dump_stacks:
            self.concerns.job_hung(JobHung(self.attempt, self.job.pids()))
        self.monitors.stop()
        self.jobstop.begin(cmd, self.job, now, self.ports)

    def _check_job_exit(self, now: float) -> None:
        assert self.job is not None
        if self.state is State.STOPPING:
            self.job.poll()
            return
        if self.job.poll() is None:
            return
        # Give the pumps a moment: the line that explains the exit (an OOM traceback) is often
        # the last one written, and its detection must be the root cause, not "crash".
        if not self.jobstop.output_done(self.job, now):
            return
        # A flood not emptied this turn: the next goes on (a detection in it comes before the end).
        if not self._drain_queue() or self._state_now() is State.STOPPING:  # or one started a stop
            return
        if self.metrics.waiting and (self.jobstop.draining(now) or self.job.pumps_done(0)):
            # The attempt's last records first: whether it made progress (no backoff) and its
            # last step; kept a chunk per turn, the next turn comes at once while any are left.
            # Output read to its end leaves a bounded number of them: all are kept (a burst the
            # parsers caught up on after the exit is the attempt's too).
            return
        info = self.ports.launcher.exit_info(self.job, evidence=True)
        self._feed(JobExited(info, self.job.group_alive(), now, self.clock.time(),
                             last_step=self.metrics.last.step if self.metrics.last else None,
                             jitter=self.rng.uniform(-1, 1), activity=self._activity()))

    def _activity(self) -> Activity | None:
        """The attempt's work besides parsed steps; None once it parsed a step (the rule needs no more)."""
        if self.job is None or self.metrics.last is not None:
            return None
        return self.activity.of_config(self.cfg)

    def _end_attempt(self, cmd: EndAttempt) -> None:
        if cmd.spawned:
            self.monitors.stop()
            self.concerns.attempt_ended(AttemptEnded(cmd, self.machine.resume, self.clock.time()))
            self.snapshots.ended(cmd.attempt, self.concerns.snapshots, self.metrics.last,
                                 self.status_cache.snapshot.get("heartbeats"))
        end_row(self.ledger, self.run_id, cmd)
        if cmd.spawned:
            self.jobstop.shutdown = None
            if self.job is not None:
                self.job.close()
            drop_heartbeat_dir_if_empty(self.state_dir, cmd.attempt)

    # ================================================================== metrics
    def _drain_metrics(self) -> None:
        """Keep a chunk of the waiting metric records (the rest waits for the next turn)."""
        batch = self.metrics.take()
        dropped = self.metrics.dropped_to_say(self.clock.monotonic(), burst_over=not batch)
        if dropped is not None:
            self.event("metrics_dropped", "warning", f"{dropped} metric record(s) in all were not kept: "
                       "the job printed them faster than the ledger takes them (a burst); the newest are kept",
                       dropped=dropped)
        if not batch:
            return
        self._feed(FirstMetric())
        if any(r.step is not None for r in batch):
            self.ports.launcher.progressed(self.clock.monotonic())  # [job] prewarm: the standby is due
        self._view = None  # its last metric moved
        self.concerns.on_metrics(MetricsBatch(batch, self.clock.monotonic()))
        rows = [(r.at, r.step, r.loss, r.grad_norm, r.tokens_per_sec, r.val_loss) for r in batch]
        try:
            self.ledger.metrics_batch(self.run_id, max(self.attempt, 0), rows)
        except Exception as e:
            log.warning("ledger_metrics_failed", error=str(e))

    # ================================================================== requests
    def _on_signal(self, sig: int) -> None:
        if sig in (signal.SIGTERM, signal.SIGINT):
            self._feed(StopRequested(signal=signal.Signals(sig).name))
        elif sig == signal.SIGHUP:  # (SIGCHLD only wakes the loop; the tick reaps)
            self.reload()

    def _on_control(self, verb: str, args: Mapping[str, Any]) -> Any:
        if verb in RUNNER_VERBS:
            return self.status() if verb == "status" else self.reload()
        refused = verb == "checkpoint-now" and refuse_checkpoint(self)  # would the job die of it? (issue 34)
        return refused or self._feed(machine_request(verb, args, self.clock.time()))

    def control(self, verb: str, args: Mapping[str, Any], timeout: float = 20.0) -> Any:
        """Called from the control server's threads: hand over to the main loop, wait for it."""
        if verb == "status":
            return self.status_cache.answer()
        return ask(self.inbox, verb, args, timeout)

    def use_config(self, cfg: Config) -> None:
        """Run on ``cfg`` from now on (a checkpoint dir or resume args found for the job)."""
        self.cfg = self.machine.cfg = cfg
        self._view = None

    def reload(self) -> dict[str, Any]:
        self.ports.notifier.reloading()
        new, reply = reload_config(self.cfg, self.config_source, self.state_dir, self.event)
        if new is not None:
            if new.job != self.cfg.job:
                self.ports.launcher.discard_standby()
            self.use_config(new)
            self.status_cache.refresh_if_used()  # `status` right after `reload` shows the new limits
        self.ports.notifier.ready()
        return reply

    # ================================================================== status
    def status(self) -> dict[str, Any]:
        now = self.clock.monotonic()
        return status_dict(self.machine, run_id=self.run_id, cfg=self.cfg, state_dir=self.state_dir,
                           pids=self.job.pids() if self.job is not None and self.state in JOB_UP else [],
                           last_metric=self.metrics.last,
                           restart_in_s=(self.timer_at if self.timer_at is not None else now) - now,
                           extras=[{"metrics_dropped": self.metrics.dropped, "prewarm": self.ports.launcher.standby_status(),
                                    # how far the console and the parsers are behind the job's output
                                    "output_lag": self.job.output_lag().as_status() if self.job is not None else None},
                                   *self.concerns.statuses()])

    def refresh_status_cache(self) -> dict[str, Any]:
        return self.status_cache.refresh()
