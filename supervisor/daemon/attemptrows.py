"""What the runner writes into an attempt's ledger row: the row at launch (argv, redacted env,
resume point, remedies, the gate's verdict), the state at its end beside the state at launch,
and how it ended (cause, action, detection, decision, shutdown, repeat, progress)."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import structlog

from ..core.messages import EndAttempt, Launch, detection_dict, jsonable
from ..events import MetricRecord
from ..job.launch import remedies_record
from ..job.process import LaunchSpec, redact_env
from .ports import LedgerStore
from .status import metric_json

log = structlog.get_logger("supervisor.daemon.runner")


def begin(ledger: LedgerStore, run_id: str, cmd: Launch, spec: LaunchSpec) -> None:
    resume = cmd.resume
    ledger.begin_attempt(run_id, cmd.attempt, list(spec.argv), spec.cwd, redact_env(spec.added_env),
                         None, resume.checkpoint, resume.step, remedies_record(cmd),
                         cmd.gate.to_dict() if cmd.gate is not None else None)  # type: ignore[attr-defined]


def snapshot_at_end(ledger: LedgerStore, run_id: str, attempt: int, at_launch: Mapping[str, Any] | None,
                    concerns: Callable[[], Mapping[str, Any]], last_metric: MetricRecord | None,
                    heartbeats: Any) -> None:
    """The state at the failure (metrics, heartbeats, GPU/host), beside the state at launch; a
    failure here is logged and the attempt's end is still recorded."""
    try:
        at_end = dict(concerns())
        at_end["last_metric"] = metric_json(last_metric) if last_metric else None
        at_end["heartbeats"] = heartbeats
        ledger.update_attempt(run_id, attempt, snapshot_json={**(at_launch or {}), "at_end": at_end})
    except Exception as e:
        log.warning("snapshot_failed", error=repr(e))


def end(ledger: LedgerStore, run_id: str, cmd: EndAttempt) -> None:
    ledger.end_attempt(
        run_id, cmd.attempt, exit_code=cmd.exit_code, signal=cmd.signal,
        cause=cmd.cause.value if cmd.cause else None, action=cmd.action.value if cmd.action else None,
        summary=cmd.summary, counted=cmd.counted,
        detection=detection_dict(cmd.detection) if cmd.detection else None,
        decision=jsonable(cmd.decision) if cmd.decision else None,
        shutdown=jsonable(cmd.shutdown) if cmd.shutdown else None,
        repeat=jsonable(cmd.repeat) if cmd.repeat else None, progressed=cmd.progressed)
