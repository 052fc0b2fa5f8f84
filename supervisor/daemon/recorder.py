"""One daemon event, recorded the one way: a log line (journal, console), a ledger row (history),
and every concern told (``[notify]`` tells a human). From any thread."""

from __future__ import annotations

from typing import Any, Callable

import structlog

from ..core.messages import Record, jsonable
from ..eventnames import EventName, UnknownNames
from ..levels import Level
from ..logsite import Site, log_helper as log_helper, logged_from  # (re-exported: the runner marks its own helper)
from .concernset import ConcernSet
from ..job.osapi import Clock as OsClock
from .plugin import Noted
from .ports import Clock, LedgerStore

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
