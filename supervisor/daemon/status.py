"""The ``status`` verb's answer: the run's state, its attempt, its job, what the concerns add."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import structlog

from ..config.model import Config
from ..core.machine import JOB_UP, Machine, State
from ..core.messages import detection_dict
from ..core.observations import MetricRecord

log = structlog.get_logger("supervisor.daemon.runner")


def metric_json(m: MetricRecord) -> dict[str, Any]:
    """``status --json`` last_metric: the watcher's shape plus how old it is."""
    from ..watch.logwatch import metric_dict  # at the first status: the watchers are not on the first launch's way

    return {**metric_dict(m), "age_s": round(time.time() - m.at, 3)}


# SPEC's `state` names the launch as one state, "starting": a tool polling for
# starting/running must not meet the machine's finer steps. Those go in `phase`.
PUBLIC_STATE = {State.PREPARING: State.STARTING, State.LAUNCHING: State.STARTING}


def status_dict(m: Machine, *, run_id: str, cfg: Config, state_dir: Path, pids: list[int],
                last_metric: MetricRecord | None, restart_in_s: float | None,
                extras: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    st: dict[str, Any] = {
        "state": PUBLIC_STATE.get(m.state, m.state).value,
        "phase": m.state.value,  # preparing (the gate, the checkpoint choice), launching (the spawn), ...
        "run_id": run_id,
        "name": cfg.job.name,
        "attempt": max(m.attempt, 0),
        "pids": pids if m.state in JOB_UP else [],
        "restarts_by_cause": dict(m.restarts_by_cause),
        "last_metric": metric_json(last_metric) if last_metric else None,
        "heartbeats": {},
        "gpus": None,
        "checkpoint": m.resume.checkpoint,
        "goodput": None,
        "last_anomaly": detection_dict(m.last_anomaly) if m.last_anomaly else None,
        # A job that exited 0: what was watched, its weights, the verdict (supervisor.core.runend).
        "end": dict(m.end) if m.end is not None else None,
        "remedies": m.remedies.as_status(),  # the value the launches get (the scale too)
        "max_restarts": cfg.policy.max_restarts,
        "state_dir": str(state_dir),
        "daemon_pid": os.getpid(),
    }
    if m.state is State.BACKOFF and restart_in_s is not None:
        st["restart_in_s"] = round(max(0.0, restart_in_s), 3)
    for extra in extras:
        st.update(extra)
    return st


class StatusCache:
    """``status`` as the control threads answer it: a snapshot the main loop refreshes (each
    status tick, and on every state change), under what other threads set since (``live``): the
    control threads never touch the machine, and a warning the journal already shows is in the
    next answer too."""

    def __init__(self, build: Callable[[], dict[str, Any]], live: Callable[[], Mapping[str, Any]],
                 booting: Callable[[], dict[str, Any] | None] = lambda: None) -> None:
        self.build = build  # on the main loop only
        self.live = live
        self.booting = booting  # the answer while the daemon starts, None once it has (see answer)
        self.snapshot: dict[str, Any] = {}  # empty until the first refresh

    def answer(self) -> dict[str, Any]:
        """From a control thread. While the daemon starts, the control socket is up before the
        concerns after it: building the full answer then met their unset state (an assertion,
        replied as ``internal`` with no message), so the start's own answer is given instead."""
        if not self.snapshot:
            early = self.booting()
            return early if early is not None else self.build()
        return {**self.snapshot, **self.live()}

    def refresh(self) -> dict[str, Any]:
        self.snapshot = self.build()
        return self.snapshot

    def refresh_if_used(self) -> None:
        """After a change (a state change, a reload): refreshed at once once `status` is served from
        the cache, or a status read right after the journal's "restart scheduled" still shows the
        old attempt. A status part failing must not undo the change just made."""
        if not self.snapshot:
            return
        try:
            self.refresh()
        except Exception as e:
            log.warning("status_refresh_failed", error=repr(e),
                        message="could not refresh the status after a change; the next tick retries")


def booting_status(attempt: int, cfg: Config, state_dir: Path, run_id: str) -> dict[str, Any] | None:
    """``status`` while the daemon starts (its plug-ins starting; the machine has not booted, so
    no attempt yet): SPEC's fields, with what is known so far, and ``phase`` saying why there is
    no more. None once the machine has booted (``attempt`` >= 0)."""
    if attempt >= 0:  # the machine's Boot launches attempt 0 (or the next one of a continued run)
        return None
    return {"state": State.STARTING.value, "phase": "daemon_starting", "run_id": run_id or None,
            "name": cfg.job.name, "attempt": 0, "pids": [], "restarts_by_cause": {}, "last_metric": None,
            "heartbeats": {}, "gpus": None, "checkpoint": None, "goodput": None, "last_anomaly": None,
            "max_restarts": cfg.policy.max_restarts, "state_dir": str(state_dir), "daemon_pid": os.getpid(),
            "message": "the daemon is starting (its monitors and the checkpoint store); the job is launched next"}
