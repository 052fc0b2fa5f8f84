"""A checkpoint request never harms the run (issue 34).

``checkpoint-now`` (the operator's verb, and the divergence precursor's request) asks the job for a
checkpoint by sending it ``shutdown.checkpoint_signal`` (SIGUSR1). That signal's default action
ends the process: a plain ``python train.py`` with no handler would be killed by the very request
meant to save it. So the signal goes only to a job known to handle it:

* every process of the job that the kernel shows (``/proc/<pid>/status``, at most
  :data:`MAX_PIDS`) catches or ignores it (``SigCgt``/``SigIgn``), and at least one catches it; or
* /proc says nothing about the job's processes (another pid namespace) and our client has written a
  heartbeat this attempt (its ``install()`` or first ``should_*()`` catches the signal).

Else the request is not sent and an event says why and how to enable it. A signal whose default
action is harmless (SIGCONT, SIGCHLD, SIGURG, SIGWINCH) is always sent.

Defense in depth: the time the signal was sent is kept per job; a job that dies of that very signal
within :data:`BLAME_WINDOW_S` ended by the supervisor's hand, and :func:`blame_supervisor_signal`
says so in its exit (the give-up rule does not take it as the job's deterministic crash).
"""
from __future__ import annotations

import signal
import time
import weakref
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..core.messages import ExitInfo, Record
from ..core.policy import BY_SUPERVISOR
from ..core.settings import signal_number
from ..eventnames import EventName
from ..job.launch import heartbeat_dir
from ..job.osapi import signal_name
from ..levels import Level

__all__ = ["BLAME_WINDOW_S", "BY_SUPERVISOR", "MAX_PIDS", "blame_supervisor_signal", "disposition",
           "refuse_checkpoint", "send_checkpoint_signal"]

MAX_PIDS = 64  # processes read per request: a request is cheap even for a job of many workers
BLAME_WINDOW_S = 10.0  # a death by the sent signal this soon after it was sent is the signal's doing
_HARMLESS = frozenset({signal.SIGCONT, signal.SIGCHLD, signal.SIGURG, signal.SIGWINCH})
_sent: "weakref.WeakKeyDictionary[Any, tuple[int, float]]" = weakref.WeakKeyDictionary()


def disposition(pid: int, sig: int) -> str | None:
    """How process ``pid`` takes ``sig``: ``caught``, ``ignored`` or ``default``; None when /proc
    does not say (gone, another namespace)."""
    bit = 1 << (sig - 1)
    masks: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("SigCgt", "SigIgn"):
                    masks[key] = int(value.strip(), 16)
    except (OSError, ValueError):
        return None
    if len(masks) < 2:
        return None
    return "caught" if masks["SigCgt"] & bit else "ignored" if masks["SigIgn"] & bit else "default"


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def _client_seen(state_dir: Path, attempt: int) -> bool:
    try:
        return any(heartbeat_dir(state_dir, max(attempt, 0)).iterdir())
    except OSError:
        return False


def why_not(pids: list[int], sig: int, client_seen: bool) -> str | None:
    """None when ``sig`` may be sent to the job's processes ``pids``; else why not, in words."""
    if sig in _HARMLESS:
        return None
    name = signal_name(sig)
    seen = [(pid, d) for pid in pids[:MAX_PIDS] if (d := disposition(pid, sig)) is not None]
    if not seen:
        return None if client_seen else (f"the job's processes could not be read in /proc and it has written no "
                                         f"client heartbeat, so it is not known to handle {name}")
    default = [pid for pid, d in seen if d == "default"]
    if default:
        pid = default[0]
        return (f"the job does not handle {name}: process {pid} ({_comm(pid)}) has no handler for it, and its "
                f"default action would end the process")
    if not any(d == "caught" for _, d in seen):
        return f"the job ignores {name}: no process of it would act on the request"
    return None


def refuse_checkpoint(runner: Any) -> dict[str, Any] | None:
    """The reply to ``checkpoint-now`` when the signal must not be sent (the event recorded); None
    when it may be sent, or no job runs (the state machine answers that). ``runner``: its job, cfg,
    state_dir, attempt and recorder."""
    job, cfg, state_dir, attempt, record = (runner.job, runner.cfg, runner.state_dir, runner.attempt,
                                            runner.recorder.record)
    if job is None:
        return None
    name = cfg.shutdown.checkpoint_signal
    sig = signal_number(name)
    try:
        pids = list(job.pids())
    except Exception:  # the leader reaped meanwhile: the machine answers
        return None
    reason = why_not(pids, sig, _client_seen(state_dir, attempt))
    if reason is None:
        return None
    message = (f"checkpoint request not sent: {reason}. The job keeps training, without this checkpoint. To "
               f"enable checkpoint requests, use the client (supervisor.client: its callback saves on "
               f"request) or install a {name} handler that saves at the next step boundary")
    record(Record(EventName.CHECKPOINT_REQUEST_NOT_SENT, Level.WARNING, message,
                  {"signal": name, "reason": reason, "pids": pids[:MAX_PIDS]}))
    return {"sent": False, "signal": name, "message": message}


def send_checkpoint_signal(job: Any, sig: int) -> None:
    """Send the checkpoint signal to the job's group, noting when (for :func:`blame_supervisor_signal`)."""
    _sent[job] = (sig, time.monotonic())
    job.signal_group(sig)


def blame_supervisor_signal(info: ExitInfo, job: Any) -> ExitInfo:
    """``info`` told as the supervisor's doing when the job died of the checkpoint signal it was
    just sent: not the job's own crash."""
    try:
        sig, at = _sent.get(job, (0, 0.0))
    except TypeError:  # not weak-referenceable: nothing was sent to it through here
        return info
    if info.signal != signal_name(sig) or time.monotonic() - at > BLAME_WINDOW_S:
        return info
    return replace(info, signal=info.signal + BY_SUPERVISOR,
                   summary=(f"killed by {info.signal}, which the supervisor sent {time.monotonic() - at:.1f} s "
                            f"before to ask for a checkpoint: the supervisor's signal ended it, not a crash of the "
                            f"job's own (it has no {info.signal} handler); not taken as a deterministic failure"))
