"""Where an event was logged: the journal's ``CODE_FILE``/``CODE_LINE``/``CODE_FUNC``.

The place is the code that decided to log the event, not the logging machinery between it and
the journal: structlog and logging, our processors (``supervisor.logsetup``,
``supervisor.ops.journal``), and the one-line helpers that log for others (the runner's event
recorder, the rate-limited ``QuietLog.say``), which mark themselves with :func:`log_helper`.
An event made in one place and logged later in another (the state machine's ``Record`` command,
carried out by the runner) names its maker with :func:`logged_from` around the log call.

Stdlib only, so any module can mark its helpers without importing the journal sender.
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

Site = tuple[str, int, str]  # (file, line, function)
F = TypeVar("F", bound=Callable[..., Any])

#: modules whose frames are logging machinery (prefix match on the frame's ``__name__``)
MACHINERY = ("structlog", "logging", "supervisor.logsetup", "supervisor.ops.journal", __name__)

_helpers: set[Any] = set()  # code objects of functions that only log for their caller
_known: ContextVar[Site | None] = ContextVar("tsup_logged_from", default=None)


def log_helper(fn: F) -> F:
    """Mark ``fn`` as a helper that logs for its caller: the caller is the event's place."""
    _helpers.add(fn.__code__)
    return fn


@contextmanager
def logged_from(site: Site | None) -> Iterator[None]:
    """Events logged inside the block were decided at ``site`` (None: found by the frame walk)."""
    token = _known.set(site)
    try:
        yield
    finally:
        _known.reset(token)


def callsite(skip: int = 1) -> Site | None:
    """(file, line, function) of the code that logged the event being processed: the site given
    by :func:`logged_from`, else the first frame outside :data:`MACHINERY` and the helpers."""
    known = _known.get()
    if known is not None:
        return known
    try:
        f: Any = sys._getframe(skip)
    except ValueError:
        return None
    while f is not None:
        if not (f.f_code in _helpers or str(f.f_globals.get("__name__", "")).startswith(MACHINERY)):
            return f.f_code.co_filename, f.f_lineno, f.f_code.co_name
        f = f.f_back
    return None


__all__ = ["MACHINERY", "Site", "callsite", "log_helper", "logged_from"]
