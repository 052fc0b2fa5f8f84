"""After a daemon crash (kill -9, the systemd watchdog) or a stop: close what the previous daemon
left open, and say what this daemon continues.

A job group left running is stopped (matched by pid AND start time, never a reused pid), its
attempt is closed as not counted, and the attempts that ended before become the history the
policy counts the restart budget on. A run continued with another command than it was last
started with (a second ``wrap`` on the same state dir, an edited config) is said at start, with
both commands: it used to carry on silently, its budget and checkpoints taken for the new one's.
"""

from __future__ import annotations

import shlex
import signal
from typing import Any, Callable

from ..config.model import Config
from ..core.causes import Cause
from ..job.launch import config_json
from ..job.osapi import OsApi, ProcRef
from ..core.policy import PastAttempt, RepeatKey
from .ports import Clock, LedgerStore

Event = Callable[..., None]


def close_previous_life(ledger: LedgerStore, run_id: str, cfg: Config, osapi: OsApi, clock: Clock,
                        event: Event) -> list[PastAttempt]:
    """Close the attempts a previous daemon left open; the history of the ended ones."""
    say_command_change(ledger.continued_config, run_id, cfg, event)
    for r in ledger.attempts(run_id):
        if r.ended_at is None:
            stopped = stop_leftover(r, cfg.shutdown.leftover_grace_s, osapi, clock)
            ledger.end_attempt(run_id, r.attempt, exit_code=None, signal=None, cause=None, action=None,
                               summary="the daemon was restarted while this attempt ran"
                                       + ("; its leftover job group was stopped" if stopped else ""),
                               counted=False)
            event("previous_attempt_closed", "warning",
                  f"attempt {r.attempt} was running when the previous daemon died; "
                  + ("its job group was still alive and has been stopped" if stopped
                     else "its job is already gone") + "; continuing the same run")
    history = []
    causes = {c.value for c in Cause}
    for r in ledger.attempts(run_id):
        if r.ended_at is not None:
            cause = Cause(r.cause) if r.cause in causes else None
            history.append(PastAttempt(r.attempt, cause, r.ended_at, r.ended_at - r.started_at, r.counted,
                                       r.progressed, repeat_key(r.repeat)))
    return history


def repeat_key(data: Any) -> RepeatKey | None:
    """The ledger's repeat_json back as a :class:`RepeatKey`; None for a row without one (or one
    an older or newer daemon wrote in another shape: then no repeat is claimed)."""
    if not isinstance(data, dict):
        return None
    try:
        return RepeatKey(**{f: data[f] for f in ("checkpoint", "resume_step", "launch", "step", "detail")})
    except (KeyError, TypeError):
        return None


def stop_leftover(r: Any, grace_s: float, osapi: OsApi, clock: Clock) -> bool:
    """SIGTERM, a short grace, SIGKILL to a job group of the previous life; False when none is left."""
    if r.pgid is None:
        return False
    leader = ProcRef(r.pid, r.leader_ctime or 0.0) if r.pid else None

    def members() -> list[int]:
        # Only processes started after the attempt (a reused pgid is someone else's).
        return [p for p in osapi.group_members(r.pgid) if osapi.started_after(p, r.started_at - 5)]

    if not members() and not (leader and leader.alive()):
        return False
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        osapi.killpg(r.pgid, sig)
        deadline = clock.monotonic() + wait
        while clock.monotonic() < deadline:
            if not members():
                return True
            clock.sleep(0.05)
    return True


def say_command_change(before: Any, run_id: str, cfg: Config, event: Event) -> None:
    """``run_command_changed`` when the continued run was last started with another command
    (both as the ledger keeps them: secrets masked, so the two compare alike)."""
    job = before.get("job") if isinstance(before, dict) else None
    if not isinstance(job, dict) or not isinstance(job.get("command"), list):
        return  # nothing recorded to compare with (a run from before the command was stored)
    new = config_json(cfg)["job"]
    old_cmd, new_cmd = [str(a) for a in job["command"]], [str(a) for a in new["command"]]
    if (old_cmd, bool(job.get("shell"))) == (new_cmd, bool(new.get("shell"))):
        return
    event("run_command_changed", "warning",
          f"the state dir's unfinished run {run_id} was last started with `{shlex.join(old_cmd)}`; this daemon "
          f"was given `{shlex.join(new_cmd)}`. Run {run_id} continues with the new command: its attempts, "
          "restart budget and checkpoints carry on (history shows each attempt's command). To start a new "
          "run instead, stop this daemon and give another --state-dir (or [state] dir)",
          old_command=old_cmd, new_command=new_cmd)
