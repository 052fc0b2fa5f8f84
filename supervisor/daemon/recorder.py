"""What the daemon records. One daemon event, recorded the one way: a log line (journal,
console), a ledger row (history), and every concern told (``[notify]`` tells a human), from any
thread (:class:`EventRecorder`). And an attempt's ledger row: the row at launch (argv, redacted
env, resume point, remedies, the gate's verdict: :func:`begin_row`), the state at its end beside
the state at launch (:class:`Snapshots`), and how it ended (cause, action, detection, decision,
shutdown, repeat, progress: :func:`end_row`)."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import structlog

from ..core.messages import EndAttempt, Launch, Record, detection_dict, jsonable
from ..core.observations import MetricRecord
from ..eventnames import EventName, UnknownNames
from ..levels import Level
from ..logsite import Site, log_helper as log_helper, logged_from  # (re-exported: the runner marks its own helper)
from ..job.launch import remedies_record
from ..job.osapi import Clock as OsClock
from ..job.process import LaunchSpec, redact_env
from .effects import AttemptField
from .plugin import ConcernSet, Noted
from .ports import Clock, EnvironmentProbe, LedgerStore
from .status import metric_json

log = structlog.get_logger("supervisor.daemon.runner")


class EventRecorder:
    """``where`` says the run id and the attempt (-1: none yet) at the moment of the event."""

    def __init__(self, ledger: LedgerStore, concerns: ConcernSet, where: Callable[[], tuple[str, int]],
                 clock: Clock | None = None) -> None:
        self.ledger = ledger
        self.concerns = concerns
        self.where = where
        self.clock = clock or OsClock()
        self._unknown_names = UnknownNames()

    @log_helper
    def event(self, event: str, level: Level | str, message: str, *, ledger_only: bool = False, code_site: Site | None = None,
              **data: Any) -> None:
        """Log one event line and keep it in the ledger (``ledger_only``: a module logged it already;
        ``code_site``: where it was decided, when not in the caller: the journal's CODE_* fields).
        ``level`` is a :class:`Level`; a plain string is read as one while the plug-ins move to it
        (a misspelt one fails here, by name, not as a missing logger method)."""
        level = Level(level)
        if self._unknown_names.first_time(event):  # still recorded below: nothing is lost
            self.event(EventName.EVENT_NAME_UNKNOWN, Level.WARNING, f"event name {event!r} is not in "
                       "supervisor.eventnames.EventName (its journal MESSAGE_ID is not fixed); it is recorded "
                       "as it is, and said once per name", name=event)
        run_id, n = self.where()
        attempt = n if n >= 0 else None
        if not ledger_only:
            with logged_from(code_site):
                log.log(level.number, event, attempt=attempt, message=message,
                        **{k: v for k, v in data.items() if v is not None})
        # A failed write (a full disk) does not raise: the ledger logs it once, counts and drops it.
        self.ledger.event(run_id, attempt, event, level, message, jsonable(data) if data else None)
        # [notify]: tell a human
        self.concerns.on_event(Noted(event, level, message, data, run_id, attempt, self.clock.time(),
                                     self.clock.monotonic()))

    def record(self, cmd: Record) -> None:
        """The state machine's event, its CODE_* fields where the machine made it (not here)."""
        self.event(cmd.event, cmd.level, cmd.message, ledger_only=cmd.ledger_only, code_site=cmd.origin, **cmd.data)


def begin_row(ledger: LedgerStore, run_id: str, cmd: Launch, spec: LaunchSpec) -> None:
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


def end_row(ledger: LedgerStore, run_id: str, cmd: EndAttempt) -> None:
    ledger.end_attempt(
        run_id, cmd.attempt, exit_code=cmd.exit_code, signal=cmd.signal,
        cause=cmd.cause.value if cmd.cause else None, action=cmd.action.value if cmd.action else None,
        summary=cmd.summary, counted=cmd.counted,
        detection=detection_dict(cmd.detection) if cmd.detection else None,
        decision=jsonable(cmd.decision) if cmd.decision else None,
        shutdown=jsonable(cmd.shutdown) if cmd.shutdown else None,
        repeat=jsonable(cmd.repeat) if cmd.repeat else None, progressed=cmd.progressed)
