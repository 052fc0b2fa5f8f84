"""The errors this package raises on purpose: one base, a few kinds.

The control server turns any :class:`SupervisorError` into an error reply carrying its ``code``
and message; anything else that escapes a handler is a bug and becomes an ``internal`` reply
(logged with its traceback), never a misleading "unknown verb".
"""

from __future__ import annotations

from .core.causes import Cause


class SupervisorError(Exception):
    """Base of the errors raised on purpose. ``code`` is the stable short name a control reply
    carries; the message says what happened and what to do."""

    code = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Conflict(SupervisorError):
    """Raised when a request does not fit the run's current state (restart while the job is
    being stopped, checkpoint-now with no job running). ``status`` shows the state; retry once
    it allows the request."""

    code = "conflict"


class UnknownVerb(SupervisorError):
    """Raised by the daemon for a control verb it does not implement; the message lists the
    verbs it knows."""

    code = "unknown_verb"


class NotAnswered(SupervisorError):
    """Raised when the daemon's main loop did not answer a control request in time (it may be
    busy); the request may still take effect, so check ``status`` before repeating it."""

    code = "timeout"


class IllegalMove(SupervisorError):
    """Raised by the state machine for a transition its table does not allow: a bug in the
    supervisor, reported as an internal error; the daemon keeps going."""

    code = "internal"


class GiveUp(SupervisorError):
    """Raised while preparing a launch when the run cannot go on: the state machine gives up (the
    daemon exits 3) and books it with :attr:`cause` (a multi-node run that gave up: ``node_lost``)."""

    code = "gave_up"

    def __init__(self, message: str, cause: Cause) -> None:
        super().__init__(message)
        self.cause = cause
