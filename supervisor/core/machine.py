"""The state machine of a supervised run: events in, commands out, nothing else.

::

      (Boot) PREPARING --Prepared--> LAUNCHING --Spawned--> STARTING --FirstMetric--> RUNNING
      PREPARING --gate failed / no progress--> GAVE_UP;   LAUNCHING --spawn failed--> GAVE_UP
      PREPARING or LAUNCHING --StopRequested--> STOPPED

      STARTING or RUNNING --JobExited 0 (group gone), EndChecked--> FINISHED (GAVE_UP: NaN weights)
                          --Detected (not warn) / restart / stop--> STOPPING --StopFinished--+
                          --JobExited (a failure)-------------------------------------------+--> (decide):
            give up --> GAVE_UP;  stop requested --> STOPPED;  relaunch --> BACKOFF, or HELD when the
            action's handler holds it

      BACKOFF --TimerFired--> PREPARING          HELD --ConditionCleared--> PREPARING
      BACKOFF --StopRequested--> STOPPED         HELD --StopRequested--> STOPPED

:data:`MOVES` lists every allowed move; any other is a bug (:class:`~supervisor.errors.IllegalMove`).
A launch is two steps: :class:`PrepareLaunch` (the gate and the checkpoint choice, seconds, off
the main loop) answered by :class:`Prepared`, then :class:`Launch` answered by :class:`Spawned`.
A stop is :class:`StopJob` answered by :class:`StopFinished`; what follows it (relaunch, give up,
exit) was decided when the stop began and waits in :attr:`Machine.pending`.

The policy (:func:`supervisor.core.policy.decide`) says what to do about a failure; the cause registry
(:mod:`supervisor.core.causes`) says how to stop, whether it counts, whether diagnostics follow.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping

from ..errors import Conflict, GiveUp, IllegalMove
from ..levels import Level
from .observations import Detection
from . import attempts
from .attempts import Pending, shutdown_plan
from .runend import end_verdict
from .policy import Decision, Failure, PastAttempt, RemediesInForce, RepeatKey, decide
from .resumecheck import handover
from .settings import RunSettings, signal_number
from .causes import ACTIONS, CAUSES, Action, Cause, Hold, StopStyle, gate_failure
from .messages import (EXIT_GAVE_UP, EXIT_OK, FRESH_START, Activity, ArmTimer, Argv, Boot, CheckEnd, CheckpointRequested,
                       Command, ConditionCleared, Detected, EndChecked,
                       EndAttempt, EscalateStop, Event, ExitInfo, Finish, FirstMetric, JobExited, Launch,
                       PrepareLaunch, Prepared, Record, RecordDetection, Reply, RestartRequested, Resume, ShutdownPlan,
                       ShutdownResult, SignalJob, Spawned, SpawnFailed, StateChanged, StopFinished, StopJob,
                       StopRequested, TimerFired, detection_dict)


class State(StrEnum):
    PREPARING = "preparing"  # a PrepareLaunch is out: the gate and the checkpoint choice
    LAUNCHING = "launching"  # a Launch is out: the job is being spawned
    STARTING = "starting"  # the job is up; no training metric yet
    RUNNING = "running"
    STOPPING = "stopping"
    BACKOFF = "backoff"
    STOPPED = "stopped"
    GAVE_UP = "gave_up"
    FINISHED = "finished"
    HELD = "held"  # the relaunch waits until a condition clears (Machine.hold says which)


_ENDS = frozenset({State.STOPPED, State.GAVE_UP, State.FINISHED})
#: The states in which the attempt's job exists (its pids mean something).
JOB_UP = frozenset({State.STARTING, State.RUNNING, State.STOPPING})
MOVES: Mapping[State, frozenset[State]] = MappingProxyType({
    State.PREPARING: frozenset({State.LAUNCHING, State.STOPPED, State.GAVE_UP}),
    State.LAUNCHING: frozenset({State.STARTING, State.STOPPED, State.GAVE_UP}),
    # A job that exits before its first metric ends from STARTING, like one from RUNNING.
    State.STARTING: frozenset({State.RUNNING, State.STOPPING, State.BACKOFF, State.HELD}) | _ENDS,
    State.RUNNING: frozenset({State.STOPPING, State.BACKOFF, State.HELD}) | _ENDS,
    State.STOPPING: frozenset({State.BACKOFF, State.HELD}) | _ENDS,
    State.BACKOFF: frozenset({State.PREPARING, State.STOPPED}),
    State.HELD: frozenset({State.PREPARING, State.STOPPED}),
    State.STOPPED: frozenset(), State.GAVE_UP: frozenset(), State.FINISHED: frozenset(),
})


class Machine:
    """One run's state; :meth:`handle` takes an event and returns the commands to carry out."""

    def __init__(self, cfg: RunSettings, state_dir: Path) -> None:
        self.cfg = cfg  # replaced on reload; read at each decision and launch
        self.state_dir = state_dir  # named in the give-up message
        self.state = State.PREPARING  # Boot prepares the first launch
        self.attempt = -1
        self.saw_metric = False  # the current attempt printed a training metric
        self.last_step: int | None = None  # the newest step the current attempt reached, when known
        self.activity: Activity | None = None  # its work besides parsed steps, as last reported
        self.launch_digest = ""  # the current attempt's argv and the env the supervisor chose
        self.repeat: RepeatKey | None = None  # what the current attempt's failure looks like
        self.pid: int | None = None
        self.pgid: int | None = None
        self.attempt_started = 0.0  # monotonic
        self.pending = Pending()
        self.hold: Hold | None = None  # HELD: what the relaunch waits for
        self.root: Detection | None = None  # the first failure of this attempt
        self.last_anomaly: Detection | None = None
        self.resume: Resume = FRESH_START
        self.history: list[PastAttempt] = []
        self.restarts_by_cause: Counter[str] = Counter()
        self.remedies = RemediesInForce()  # from the ladders climbed so far, for every following attempt
        self.diagnostics = False  # after a failed validation: the next attempts say more
        self.stop_requests = 0
        # The first stop request's signal (SIGTERM from systemd, Slurm, Kubernetes): the daemon then
        # exits 128 + its number, so a scheduler sees an interrupted run (requeue), not success.
        self.stop_signal: str | None = None
        self.exit_code: int | None = None
        self.exit_reason = ""
        self.end: Mapping[str, Any] | None = None  # the verdict on a job that exited 0 (status "end")
        self._out: list[Command] = []
        self._handlers: Mapping[type, Callable[[Any], None]] = {
            Boot: self._boot, Prepared: self._prepared, Spawned: self._spawned, SpawnFailed: self._spawn_failed,
            FirstMetric: self._first_metric, Detected: self._detected, JobExited: self._job_exited,
            StopFinished: self._stop_finished, TimerFired: self._timer, StopRequested: self._stop_requested,
            RestartRequested: self._restart_requested, CheckpointRequested: self._checkpoint_requested,
            ConditionCleared: self._cleared, EndChecked: self._end_checked,
        }

    def handle(self, event: Event) -> list[Command]:
        """Apply ``event``; the commands, in the order they must be carried out. Raises
        :class:`~supervisor.errors.Conflict` for a request the current state refuses."""
        self._out = []
        self._handlers[type(event)](event)
        out, self._out = self._out, []
        return out

    @property
    def counted_restarts(self) -> int:
        return sum(1 for p in self.history if p.counted and p.cause is not None)

    # ------------------------------------------------------------------ helpers
    def _do(self, *commands: Command) -> None:
        self._out.extend(commands)

    def _record(self, event: str, level: Level, message: str, *, ledger_only: bool = False, **data: Any) -> None:
        self._do(Record(event, level, message, data, ledger_only))

    def _move(self, new: State, why: str) -> None:
        if new is self.state:
            return
        if new not in MOVES[self.state]:
            raise IllegalMove(f"no move from {self.state.value} to {new.value} ({why})")
        old, self.state = self.state, new
        self._do(StateChanged(old.value, new.value, why, self.attempt))

    def _decide(self, failure: Failure, now: float, wall: float, jitter: float) -> Decision:
        if failure.step is not None:
            self.last_step = max(failure.step, self.last_step or failure.step)
        where = failure.onset_step if failure.onset_step is not None else failure.step
        if where is None and failure.cause is not Cause.CRASH:
            where = self.last_step
        self.repeat = RepeatKey(self.resume.checkpoint, self.resume.step, self.launch_digest, where, failure.detail)
        return decide(self.cfg, list(self.history), failure, now=wall, ran_s=now - self.attempt_started,
                      jitter_draw=jitter, repeat=self.repeat,
                      progressed=self._progressed())

    def _progressed(self) -> bool:
        p = self.cfg.policy
        return attempts.progressed(self.saw_metric, self.last_step, self.resume, self.activity,
                                   after_s=p.blind_progress_after_s, active_s=p.blind_progress_active_s)

    # ------------------------------------------------------------------ launching
    def _boot(self, ev: Boot) -> None:
        self.attempt = ev.next_attempt - 1
        self.history = list(ev.history)
        self.restarts_by_cause = Counter(p.cause.value for p in ev.history if p.cause is not None)
        self._launch()

    def _launch(self) -> None:
        """(initial) | BACKOFF | HELD -> PREPARING: prepare off the main loop."""
        self._move(State.PREPARING, "launching")
        self.attempt += 1
        decision = self.pending.decision
        onset = attempts.onset_step(self.root, self.last_anomaly) if decision else None
        self._do(PrepareLaunch(self.attempt, decision.action if decision else Action.RESTART, onset,
                               self.pending.explicit_checkpoint))

    def _prepared(self, ev: Prepared) -> None:
        """PREPARING -> LAUNCHING, or GAVE_UP when the gate or the checkpoint choice failed."""
        if self.state is not State.PREPARING:
            return  # stopped while preparing: the result is dropped
        if isinstance(ev.error, GiveUp):  # a multi-node run gave up, say
            self._give_up(str(ev.error), ev.error.cause)
            return
        if ev.error is not None:
            self._record("checkpoint_selection_failed", Level.ERROR, f"choosing a checkpoint failed: {ev.error!r}; "
                         "starting without one would lose progress, so giving up")
            self._give_up(f"could not choose a checkpoint to resume from: {ev.error}", Cause.CHECKPOINT_LOAD_ERROR)
            return
        if ev.no_progress is not None:
            self._give_up(ev.no_progress, Cause.NO_PROGRESS)
            return
        if ev.gate is not None and not ev.gate.passed:
            cause, where = gate_failure(ev.gate.failed_checks)
            self._give_up(f"the pre-launch health gate failed: {ev.gate.summary()}; look at {where} "
                          "before restarting", cause)
            return
        self.resume = ev.resume or FRESH_START
        self.root = None
        r = self.remedies
        self._move(State.LAUNCHING, "prepared")
        self._do(Launch(self.attempt, self.resume, ev.gate, r.env, r.args, r.skip_batches, self.diagnostics, r.scale))

    def _spawned(self, ev: Spawned) -> None:
        if self.state is State.LAUNCHING:
            self._move(State.STARTING, "job spawned")
        self.saw_metric, self.last_step, self.repeat, self.activity = False, None, None, None
        self.launch_digest = attempts.launch_digest(ev.argv, self.remedies.env, self.remedies.skip_batches,
                                                    self.diagnostics)
        self.pid, self.pgid = ev.pid, ev.pgid
        self.attempt_started = ev.now
        handed, resume_txt = handover(self.resume, bool(self.cfg.job.resume_args))
        self._record("job_started", Level.INFO,
                     f"attempt {self.attempt} started (pid {ev.pid}, restarts so far {self.counted_restarts}/"
                     f"{self.cfg.policy.max_restarts}); {resume_txt}", pid=ev.pid, argv=Argv(tuple(ev.argv)),
                     checkpoint=self.resume.checkpoint, resume_step=self.resume.step, handed=handed)
        self.pending = Pending()

    def _spawn_failed(self, ev: SpawnFailed) -> None:
        self._do(EndAttempt(self.attempt, Cause.CRASH, Action.GIVE_UP, f"cannot start: {ev.error}", True,
                            spawned=False))
        self._give_up(f"cannot start the job: {ev.error} (cwd {ev.cwd}; its argv in this event's argv); "
                      "fix job.command / job.workdir", Cause.CRASH, argv=Argv(tuple(ev.argv)))

    def _first_metric(self, _ev: FirstMetric) -> None:
        if self.state in JOB_UP:
            self.saw_metric = True
        if self.state is State.STARTING:
            self._move(State.RUNNING, "first metric seen")

    # ------------------------------------------------------------------ failures
    def _detected(self, ev: Detected) -> None:
        d = ev.detection
        if self.state not in JOB_UP:
            return
        if ev.activity is not None:
            self.activity = ev.activity
        self.last_anomaly = d
        data = detection_dict(d)
        if self.root is not None or self.state is State.STOPPING:
            self._record("detection_noted", Level.INFO, f"also seen while stopping: {d.summary}", **data)
            return
        decision = self._decide(Failure(d.cause, d.summary, d.suggested_action, d.step, d.onset_step),
                                ev.now, ev.wall, ev.jitter)
        if not ACTIONS[decision.action].ends_attempt:
            self._record("detection_warned", Level.WARNING, f"{d.summary} (from {d.source}); {decision.reason}", **data)
            return
        self.root = d
        self._do(RecordDetection(self.attempt, d))
        self._record("failure_detected", Level.WARNING,
                     f"attempt {self.attempt} failing: {d.cause.value}"
                     + (f" at step {d.step}" if d.step is not None else "") + f": {d.summary}; "
                     + attempts.what_next(decision), cause=d.cause.value, step=d.step, onset_step=d.onset_step,
                     evidence=d.evidence, source=d.source, action=decision.action.value)
        self.pending = replace(self.pending, decision=decision)
        self._begin_stop(shutdown_plan(self.cfg, d.cause, decision))

    def _begin_stop(self, plan: ShutdownPlan) -> None:
        """STARTING/RUNNING -> STOPPING."""
        hung = self.root is not None and CAUSES[self.root.cause].stop is StopStyle.HUNG
        self._do(StopJob(plan, dump_stacks=hung))
        self._move(State.STOPPING, plan.reason)

    def _job_exited(self, ev: JobExited) -> None:
        """The leader exited by itself: stop what is left of its group, then decide."""
        if self.state not in (State.STARTING, State.RUNNING):
            return
        info = ev.info
        if ev.activity is not None:
            self.activity = ev.activity
        if info.cause is None:
            self.pending = replace(self.pending, decision=None, exit_after=True)
        else:
            if ev.last_step is not None:
                self.last_step = max(ev.last_step, self.last_step or ev.last_step)
            d = Detection(info.cause, info.summary, "exit",
                          value=float(info.exit_code) if info.exit_code is not None else None,
                          evidence=info.oom_evidence or (info.root_cause or {}).get("line"), step=ev.last_step,
                          details={"root_cause": dict(info.root_cause)} if info.root_cause else {}, at=ev.wall)
            self.root = d
            detail = info.signal or (f"exit {info.exit_code}" if info.exit_code is not None else "")
            decision = self._decide(Failure(d.cause, d.summary, step=ev.last_step, detail=detail),
                                    ev.now, ev.wall, ev.jitter)
            if not ACTIONS[decision.action].ends_attempt:  # a crash cannot be "warned": the job is gone
                decision = Decision(Action.GIVE_UP, d.cause, f"[on.{d.cause.value}] action = "
                                                              f"{decision.action.value}, but the job exited; "
                                                              "nothing left to supervise")
            self.pending = replace(self.pending, decision=decision)
        if ev.group_alive:
            plan = attempts.leftovers_plan(self.cfg)
            self._record("job_leftovers", Level.WARNING,
                         f"the job's main process ended ({info.summary}) but processes of its group remain; "
                         f"stopping them (SIGKILL after {plan.grace_s:g} s)")
            self._do(StopJob(plan, leftovers=True))
            self._move(State.STOPPING, "leftovers")
            return
        self._after_stop(info, None, ev.now, ev.wall)

    def _stop_finished(self, ev: StopFinished) -> None:
        if self.state is State.STOPPING:
            self._after_stop(ev.info, ev.shutdown, ev.now, ev.wall)

    def _after_stop(self, info: ExitInfo, shutdown: ShutdownResult | None, now: float, wall: float) -> None:
        """STOPPING (or a job that exited) -> BACKOFF | STOPPED | FINISHED | GAVE_UP."""
        ran = now - self.attempt_started
        decision = self.pending.decision
        cause = self.root.cause if self.root else None
        counted = (cause is not None and CAUSES[cause].counted
                   and (decision is None or ACTIONS[decision.action].counted))
        summary = self.root.summary if self.root else info.summary
        repeat = self.repeat if cause is not None and self.root is not None and cause is self.root.cause else None
        progressed = self._progressed()
        self._do(EndAttempt(self.attempt, cause, decision.action if decision else None, summary, counted,
                            info.exit_code, info.signal, self.root, decision, shutdown, repeat=repeat,
                            progressed=progressed))
        self.history.append(PastAttempt(self.attempt, cause, wall, ran, counted, progressed, repeat))
        if self.pending.exit_after:
            if cause is None and not self.stop_requests and info.exit_code == 0:
                self._do(CheckEnd(self.attempt, ran, wall))  # EndChecked says how it finished (core/runend.py)
            else:
                self._finish(State.STOPPED, attempts.stopped_code(self.stop_signal),
                             "stopped on request after a graceful stop of the job"
                             + (" (escalated to SIGKILL)" if shutdown and shutdown.escalated else ""))
            return
        if decision is None:
            decision = Decision(Action.GIVE_UP, cause or Cause.CRASH, "no decision recorded")
        if not decision.relaunch:
            self._give_up(f"attempt {self.attempt} failed: {summary}; {decision.reason}", decision.cause)
            return
        # Counted only here, where a relaunch follows: the attempt given up on (or stopped) is no
        # restart; `status` of the ended run (read from the ledger) and tsup_restarts_total agree.
        if cause is not None:
            self.restarts_by_cause[cause.value] += 1
        self._apply_remedies(decision)
        if CAUSES[decision.cause].diagnostics:
            self.diagnostics = True
        self.pending = Pending(decision=decision, explicit_checkpoint=self.pending.explicit_checkpoint)
        self.hold = attempts.hold_for(decision)
        if self.hold is not None:  # no timer: a ConditionCleared for its cause (or an operator's restart) relaunches
            self._move(State.HELD, self.hold.until)
            self._do(attempts.relaunch_held(self.attempt, decision, self.hold, summary, ran))
            return
        self._do(ArmTimer(decision.delay_s))
        self._move(State.BACKOFF, decision.cause.value)
        self._do(attempts.restart_scheduled(self.attempt, decision, summary, ran))

    def _cleared(self, ev: ConditionCleared) -> None:
        if self.state is not State.HELD or self.hold is None or ev.cause is not self.hold.cause:
            return  # nothing waits for it
        self._record("relaunch_released", Level.INFO, f"{ev.cause.value} cleared ({ev.summary}); relaunching",
                     cause=ev.cause.value)
        self.hold = None
        self._launch()

    def _apply_remedies(self, decision: Decision) -> None:
        r = decision.remedies
        if r.rungs:
            self.remedies = self.remedies.plus(r)
            self._do(attempts.remedies_applied(decision))

    def _timer(self, _ev: TimerFired) -> None:
        if self.state is State.BACKOFF:
            self._launch()

    def _end_checked(self, ev: EndChecked) -> None:
        """What was watched and the newest checkpoint's weights: the words of the end, its exit code."""
        if self.exit_code is not None:
            return
        v = end_verdict(ev.facts, attempt=self.attempt, ran_s=ev.asked.ran_s, wall=ev.asked.wall)
        self.end = data = v.to_json(ev.facts)
        if v.unwatched:
            self._record("run_unwatched", Level.WARNING, v.unwatched, **data)
        if v.nonfinite:
            self._record("checkpoint_nonfinite_at_end", Level.ERROR, v.nonfinite, **data)
            self._give_up(v.reason, Cause.NAN)
        else:
            self._finish(State.FINISHED, EXIT_OK, v.reason, verdict=v.verdict.value)

    def _give_up(self, reason: str, cause: Cause, **data: object) -> None:
        self._move(State.GAVE_UP, cause.value)
        self._do(attempts.gave_up(reason, cause, self.state_dir, **data))
        self._finish(State.GAVE_UP, EXIT_GAVE_UP, reason)

    def _finish(self, state: State, code: int, reason: str, **data: Any) -> None:
        self._move(state, reason)
        if state is not State.GAVE_UP:
            self._record("daemon_exiting", Level.INFO, reason, exit_code=code, **data)
        self.exit_reason, self.exit_code = reason, code
        self._do(Finish(state.value, code, reason))

    # ------------------------------------------------------------------ requests
    def _stop_requested(self, ev: StopRequested) -> None:
        if ev.signal is not None:
            self._record("signal_received", Level.INFO, f"received {ev.signal}"
                         + ("; stopping the job gracefully" if self.stop_requests == 0 else "; escalating to SIGKILL"))
        if self.stop_requests == 0:
            self.stop_signal = ev.signal
        self.stop_requests += 1
        code = attempts.stopped_code(self.stop_signal)
        if self.state in (State.BACKOFF, State.HELD, State.PREPARING, State.LAUNCHING):
            self._finish(State.STOPPED, code, "stopped on request while waiting to restart")
        elif self.state is State.STOPPING:
            self.pending = replace(self.pending, decision=None, exit_after=True)
            if ev.escalate_on_repeat and self.stop_requests > 1:
                self._do(EscalateStop())
        elif self.state in (State.STARTING, State.RUNNING):
            s = self.cfg.shutdown
            self._record("stop_requested", Level.INFO, f"stop requested; stopping the job ({s.mode}, grace "
                                                   f"{s.grace_s:g} s), then the daemon exits {code}")
            self.pending = Pending(exit_after=True)
            self._begin_stop(shutdown_plan(self.cfg, None, None))
        self._do(Reply({"accepted": True, "message": f"stopping the job gracefully, then the daemon exits {code}"}))

    def _restart_requested(self, ev: RestartRequested) -> None:
        if self.state not in (State.STARTING, State.RUNNING, State.BACKOFF, State.HELD):
            raise Conflict(f"cannot restart while {self.state.value}"
                           + (" (a launch is being prepared)" if self.state is State.PREPARING else ""))
        action = Action.ROLLBACK if ev.rollback else Action.RESTART
        decision = Decision(action, Cause.MANUAL, f"operator request ({ev.reason})")
        self.pending = Pending(decision=decision, explicit_checkpoint=ev.checkpoint)
        if self.state is State.BACKOFF:
            self._do(ArmTimer(0.0), Reply({"accepted": True, "message": "restarting now (was waiting in backoff)"}))
            return
        if self.state is State.HELD:  # the operator overrides the hold
            until, self.hold = self.hold.until if self.hold else "?", None
            self._launch()
            self._do(Reply({"accepted": True, "message": f"restarting now (was waiting until {until})"}))
            return
        self.root = Detection(Cause.MANUAL, f"operator restart: {ev.reason}", "control", at=ev.wall)
        self.repeat = None
        self._record("restart_requested", Level.WARNING, f"operator restart ({ev.reason}); stopping the job, then "
                     f"{action.value}" + (f" from {ev.checkpoint}" if ev.checkpoint else ""), cause="manual")
        self._begin_stop(shutdown_plan(self.cfg, Cause.MANUAL, decision))
        self._do(Reply({"accepted": True, "message": f"stopping the job, then {action.value}"}))

    def _checkpoint_requested(self, _ev: CheckpointRequested) -> None:
        if self.state not in (State.STARTING, State.RUNNING):
            raise Conflict(f"no running job (state {self.state.value})")
        name = self.cfg.shutdown.checkpoint_signal
        self._do(SignalJob(signal_number(name)))
        self._record("checkpoint_requested", Level.INFO, f"sent {name} to the job: it should write a checkpoint "
                                                     "at its next step boundary and keep training")
        self._do(Reply({"signal": name, "pgid": self.pgid}))

