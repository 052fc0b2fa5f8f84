"""The ``status`` verb's answer: the run's state, its attempt, its job, what the concerns add."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..config.model import Config
from ..core.machine import Machine, State
from ..core.messages import detection_dict
from ..events import MetricRecord
from ..watch.logwatch import metric_dict


def metric_json(m: MetricRecord) -> dict[str, Any]:
    """``status --json`` last_metric: the watcher's shape plus how old it is."""
    return {**metric_dict(m), "age_s": round(time.time() - m.at, 3)}


def status_dict(m: Machine, *, run_id: str, cfg: Config, state_dir: Path, pids: list[int],
                last_metric: MetricRecord | None, restart_in_s: float | None,
                extras: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    st: dict[str, Any] = {
        "state": m.state.value,
        "run_id": run_id,
        "name": cfg.job.name,
        "attempt": max(m.attempt, 0),
        "pids": pids if m.state in (State.STARTING, State.RUNNING, State.STOPPING) else [],
        "restarts_by_cause": dict(m.restarts_by_cause),
        "last_metric": metric_json(last_metric) if last_metric else None,
        "heartbeats": {},
        "gpus": None,
        "checkpoint": m.resume.checkpoint,
        "goodput": None,
        "last_anomaly": detection_dict(m.last_anomaly) if m.last_anomaly else None,
        "remedies": {"env": dict(m.remedy_env), "args": list(m.remedy_args), "skip_batches": m.skip_batches},
        "max_restarts": cfg.policy.max_restarts,
        "state_dir": str(state_dir),
        "daemon_pid": os.getpid(),
    }
    if m.state is State.BACKOFF and restart_in_s is not None:
        st["restart_in_s"] = round(max(0.0, restart_in_s), 3)
    for extra in extras:
        st.update(extra)
    return st
