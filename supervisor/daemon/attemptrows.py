"""What the runner writes into an attempt's ledger row: the row at launch (argv, redacted env,
resume point, remedies, the gate's verdict), the state at its end beside the state at launch,
and how it ended (cause, action, detection, decision, shutdown, repeat, progress)."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import structlog

from ..core.messages import EndAttempt, Launch, detection_dict, jsonable
from ..core.observations import MetricRecord
from ..job.launch import remedies_record
from ..job.process import LaunchSpec, redact_env
from .effects import AttemptField
from .ports import EnvironmentProbe, LedgerStore
from .status import metric_json

log = structlog.get_logger("supervisor.daemon.runner")


def begin(ledger: LedgerStore, run_id: str, cmd: Launch, spec: LaunchSpec) -> None:
    resume = cmd.resume
    ledger.begin_attempt(run_id, cmd.attempt, list(spec.argv), spec.cwd, redact_env(spec.added_env),
                         None, resume.checkpoint, resume.step, remedies_record(cmd),
                         cmd.gate.to_dict() if cmd.gate is not None else None)  # type: ignore[attr-defined]


class Snapshots:
    """Each attempt's snapshot: what it runs on (the environment probe), what the monitors saw at
    launch and at its end. The probe runs beside the first launch and may arrive after it (or
    after that attempt's end): the rows written without it are completed when it does."""

    def __init__(self, apply: Callable[[AttemptField], None], environment: EnvironmentProbe) -> None:
        self.apply = apply  # the runner's one write path of an attempt's fields
        self.environment = environment
        self.at_launch: dict[str, Any] = {}  # the current attempt's, without the probe
        self._incomplete: dict[int, dict[str, Any]] = {}  # by attempt: written before the probe came

    def launched(self, attempt: int, own: Mapping[str, Any]) -> None:
        self.at_launch = dict(own)
        self._write(attempt, self.at_launch)

    def ended(self, attempt: int, concerns: Callable[[], Mapping[str, Any]],
              last_metric: MetricRecord | None, heartbeats: Any) -> None:
        """The state at the failure (metrics, heartbeats, GPU/host), beside the state at launch; a
        failure here is logged and the attempt's end is still recorded."""
        try:
            at_end = dict(concerns())
            at_end["last_metric"] = metric_json(last_metric) if last_metric else None
            at_end["heartbeats"] = heartbeats
            self._write(attempt, {**self.at_launch, "at_end": at_end})
        except Exception as e:
            log.warning("snapshot_failed", error=repr(e))

    def complete(self, wait: float = 0.0) -> None:
        """Add the probe to the rows written before it came (waiting up to ``wait`` seconds for it)."""
        if not self._incomplete:
            return
        env = self.environment.probed(wait)
        if env is None:
            return
        rows, self._incomplete = self._incomplete, {}
        for attempt, row in rows.items():
            self.apply(AttemptField(attempt, snapshot={**env, **row}))

    def _write(self, attempt: int, row: dict[str, Any]) -> None:
        env = self.environment.probed()
        if env is None:
            self._incomplete[attempt] = row
        else:
            self._incomplete.pop(attempt, None)  # this row is newer than the one kept
        self.apply(AttemptField(attempt, snapshot={**(env or {}), **row}))


def end(ledger: LedgerStore, run_id: str, cmd: EndAttempt) -> None:
    ledger.end_attempt(
        run_id, cmd.attempt, exit_code=cmd.exit_code, signal=cmd.signal,
        cause=cmd.cause.value if cmd.cause else None, action=cmd.action.value if cmd.action else None,
        summary=cmd.summary, counted=cmd.counted,
        detection=detection_dict(cmd.detection) if cmd.detection else None,
        decision=jsonable(cmd.decision) if cmd.decision else None,
        shutdown=jsonable(cmd.shutdown) if cmd.shutdown else None,
        repeat=jsonable(cmd.repeat) if cmd.repeat else None, progressed=cmd.progressed)
