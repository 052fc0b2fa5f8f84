"""Pure bookkeeping of one attempt for :class:`~supervisor.core.machine.Machine`: what follows its
stop (:class:`Pending`), how it is stopped (:func:`shutdown_plan`), whether it progressed, what
its launch looked like (:func:`launch_digest`), and the records written when it starts and ends.
Functions of their arguments only, so the machine keeps the state and this module the rules."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from ..levels import Level
from .observations import Detection
from .causes import ACTIONS, CAUSES, Cause, Hold, StopStyle
from .messages import EXIT_OK, Activity, Mode, Record, Resume, ShutdownPlan
from .policy import Decision
from .settings import RunSettings, signal_number


@dataclass(frozen=True)
class Pending:
    """What happens once the current stop completes (the machine replaces it, never edits it:
    a concern's view of it cannot change under it)."""

    decision: Decision | None = None  # relaunch or give up
    exit_after: bool = False  # an operator stop (or the job's success): exit 0
    explicit_checkpoint: str | None = None  # restart --from


def shutdown_plan(cfg: RunSettings, cause: Cause | None, decision: Decision | None) -> ShutdownPlan:
    """How to stop the job for ``cause`` (None: an operator stop) given what follows."""
    s = cfg.shutdown
    mode, grace = Mode(s.mode), s.grace_s
    if cause is not None and CAUSES[cause].stop is StopStyle.HUNG:
        mode, grace = Mode.GRACEFUL, s.hang_grace_s  # a hung job flushes nothing: short grace
    if mode is Mode.HYBRID and decision is not None and not ACTIONS[decision.action].emergency_checkpoint:
        mode = Mode.GRACEFUL  # an emergency checkpoint of a diverged model, or one nothing resumes from, is worthless
    return ShutdownPlan(mode, grace, signal_number(s.stop_signal), signal_number(s.checkpoint_signal),
                        s.checkpoint_timeout_s, reason=cause.value if cause else "stop")


def leftovers_plan(cfg: RunSettings) -> ShutdownPlan:
    """Stopping what is left of the group after its leader exited: nothing to checkpoint."""
    s = cfg.shutdown
    return ShutdownPlan(Mode.GRACEFUL, s.leftover_grace_s, signal_number(s.stop_signal), reason="leftovers")


def progressed(saw_metric: bool, last_step: int | None, resume: Resume, activity: Activity | None = None,
               *, after_s: float = 60.0, active_s: int = 5) -> bool:
    """The attempt made progress (no backoff before the relaunch, the streak of failures ends):

    - it trained: it yielded a metric and, when the steps are known, went past the step it
      resumed from; or
    - no metric was ever parsed from it (a blind attempt) and it showed work past its start-up
      (:func:`showed_work`): its output or its files say it trained, even if we could not read how far.
    """
    if not saw_metric:
        return showed_work(activity, after_s, active_s)
    if last_step is None or resume.step is None:
        return True
    return last_step > resume.step


def showed_work(activity: Activity | None, after_s: float, active_s: int) -> bool:
    """A blind attempt's work, the rule of ``[policy] blind_progress_after_s`` / ``blind_progress_active_s``:
    past its first ``after_s`` seconds (imports, data loading, model set-up) it kept printing,
    output arriving in at least ``active_s`` distinct seconds, or it changed a file in its
    checkpoint dir or watched files. A crash at start-up prints its traceback within a second or
    two, so it never counts; ``active_s`` <= 0 turns the rule off (only parsed steps count)."""
    if activity is None or active_s <= 0:
        return False
    if activity.files_changed_s is not None and activity.files_changed_s >= after_s:
        return True
    return sum(1 for s in activity.active_s if s >= after_s) >= active_s


def onset_step(root: Detection | None, last_anomaly: Detection | None) -> int | None:
    """Where the attempt's trouble began: the failure's onset, else its step (rollback targets it)."""
    d = root or last_anomaly
    if d is None:
        return None
    return d.onset_step if d.onset_step is not None else d.step


def stopped_code(stop_signal: str | None) -> int:
    """0 for ``transformer-supervisor stop``; 128 + N when signal N stopped an unfinished run."""
    if stop_signal is None:
        return EXIT_OK
    return 128 + int(signal_number(stop_signal))


def launch_digest(argv: Sequence[str], env: Mapping[str, str], skip_batches: int, diagnostics: bool) -> str:
    """The launch, for comparing attempts: argv and the env the supervisor chose (not the inherited env)."""
    blob = json.dumps([list(argv), sorted(env.items()), skip_batches, diagnostics])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def hold_for(decision: Decision) -> Hold | None:
    """What the relaunch after ``decision`` waits for, when its action's handler holds it."""
    handler = ACTIONS[decision.action].handler
    return handler.hold(decision.cause) if handler is not None and decision.relaunch else None


def what_next(decision: Decision) -> str:
    if not decision.relaunch:
        return f"giving up after stopping the job ({decision.reason})"
    hold = hold_for(decision)
    if hold is not None:
        return f"stopping the job, then waiting until {hold.until} before relaunching ({decision.reason})"
    return (f"stopping the job, then {decision.action.value} in {decision.delay_s:.1f} s "
            f"(restart {decision.restarts_in_window}/{decision.max_restarts}; {decision.reason})")


def remedies_applied(decision: Decision) -> Record:
    r = decision.remedies
    scaled = "".join(f"; {flag} x {factor:g}" for flag, factor in r.scale.items())
    return Record("remedies_applied", Level.WARNING,
                  f"{decision.cause.value} repeated: applying remedies {list(r.rungs)} of "
                  f"[on.{decision.cause.value}] to the next attempts{scaled}",
                  {"env": dict(r.env), "args": list(r.args), "skip_batches": r.skip_batches, "scale": dict(r.scale)})


def restart_scheduled(attempt: int, decision: Decision, summary: str, ran_s: float) -> Record:
    return Record("restart_scheduled", Level.WARNING,
                  f"attempt {attempt} failed: {decision.cause.value} ({summary}) after {ran_s:.1f} s; "
                  f"{decision.action.value} {decision.restarts_in_window}/{decision.max_restarts} "
                  f"in {decision.delay_s:.1f} s ({decision.delay_reason or 'no reason recorded'})",
                  {"cause": decision.cause.value, "action": decision.action.value,
                   "delay_s": round(decision.delay_s, 3), "delay_reason": decision.delay_reason,
                   "remedies": decision.remedies.as_json() or None})


def relaunch_held(attempt: int, decision: Decision, hold: Hold, summary: str, ran_s: float) -> Record:
    counted = "" if ACTIONS[decision.action].counted else " (not counted against the restart budget)"
    return Record("relaunch_held", Level.WARNING,
                  f"attempt {attempt} failed: {decision.cause.value} ({summary}) after {ran_s:.1f} s; "
                  f"{decision.action.value}: the next attempt waits until {hold.until}{counted}",
                  {"cause": decision.cause.value, "action": decision.action.value, "until": hold.until,
                   "waits_for": hold.cause.value})


def gave_up(reason: str, cause: Cause, state_dir: Path, **data: object) -> Record:
    return Record("gave_up", Level.CRITICAL, f"gave up: {reason}. The job is not restarted; a human should "
                                         f"look at the journal, `transformer-supervisor history` and the "
                                         f"state dir {state_dir}", {"cause": cause.value, **data})
