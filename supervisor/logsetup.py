"""structlog set-up: one event per line on stderr, ``event=<name>``.

Console on a TTY: the demo's narration (``supervisor/narration.py``: ``[HH:MM:SS] !! detected nan
at step 120 ...``, then the evidence and the decision; other events compactly); logfmt ``key=value`` lines (structlog's own
``LogfmtRenderer``) *without* timestamps under the journal (``JOURNAL_STREAM`` set: journald stamps
them); JSON on request. In every format:

- the timestamp key is ``ts`` (ISO 8601 UTC in logfmt and JSON, ``HH:MM:SS`` on the console);
- a key whose value is None is left out (no ``attempt=None``);
- in logfmt a list or dict value is JSON (``argv="[\\"python\\",\\"train.py\\"]"``, quoted and
  escaped the logfmt way), never a Python repr; a control character in any value is written as
  its escape (:mod:`supervisor.textescape`, bidi controls too), so a job's text never forges a line
  or a field, nor reorders one;
- ``log.exception(...)`` and ``exc_info=`` keep the traceback: the ``exception`` key holds it
  (logfmt escapes its newlines as ``\\n``; the console prints it below the line; the journal
  entry carries it in its MESSAGE and in ``TSUP_EXCEPTION``);
- every value passes the one redaction gate (:func:`supervisor.redact.redact_data`) after the
  traceback is formatted and before the journal sender or any renderer sees it: a secret-named
  key's value, and secrets inside any text (a sample line, an env dict, a traceback), are masked.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Callable, Mapping, MutableMapping, TextIO

import structlog

from . import strictjson
from .humanize import value as spell
from .narration import ConsoleRenderer, said_at_default
from .job.consoleline import event_stream
from .redact import redact_data
from .textescape import Mode, escape

Processor = Callable[[Any, str, MutableMapping[str, Any]], Any]
_extra: list[Processor] = []

#: the one timestamp key, in every format
TIMESTAMP_KEY = "ts"
#: where a formatted traceback goes (structlog's own name for it)
EXCEPTION_KEY = "exception"


def mask_secrets(_logger: Any, _name: str, ed: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """The redaction gate for log and journal lines: every value as :func:`redact_data` shows it
    (the event's name is ours, never a secret)."""
    event = ed.get("event")
    masked = redact_data({k: v for k, v in ed.items() if k != "event"})
    ed.clear()
    if event is not None:
        ed["event"] = event
    ed.update(masked)
    return ed


def drop_none(_logger: Any, _name: str, ed: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Leave out keys whose value is None: ``attempt=None`` says nothing."""
    for k in [k for k, v in ed.items() if v is None and k != "event"]:
        del ed[k]
    return ed


_format_exc_info = structlog.processors.ExceptionRenderer()
_stack_info = structlog.processors.StackInfoRenderer()


def format_tracebacks(logger: Any, name: str, ed: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """``exc_info`` (set by ``log.exception()`` or ``exc_info=``) -> the traceback text under
    ``exception``; ``stack_info=True`` -> ``stack``. A no-op when neither is there."""
    if "stack_info" in ed:
        ed = _stack_info(logger, name, ed)
    if ed.get("exc_info"):
        ed = _format_exc_info(logger, name, ed)
    else:
        ed.pop("exc_info", None)
    return ed


_LOGFMT = structlog.processors.LogfmtRenderer(key_order=["event", "level", TIMESTAMP_KEY], drop_missing=True,
                                              bool_as_flag=False)


def render_logfmt(logger: Any, name: str, event_dict: Mapping[str, Any]) -> str:
    """``event=NAME level=... ts=... key=value ... message="..."``: structlog's LogfmtRenderer with
    the event first and the message last (a human scanning the journal reads "event=... msg"),
    no None values and the traceback kept. Does not modify ``event_dict``."""
    ed: dict[str, Any] = dict(event_dict)
    ed = dict(format_tracebacks(logger, name, ed))
    drop_none(logger, name, ed)
    for k, v in ed.items():
        if not isinstance(v, (str, bool, int, float)):  # JSON, which any reader parses (a repr is Python's only)
            v = spell(v)
        if isinstance(v, str):  # logfmt writes "\n" itself; a job's \r, ESC or bidi control is escaped
            v = escape(v, Mode.FIELD)
        ed[k] = v
    for last in ("message", EXCEPTION_KEY, "stack"):
        if last in ed:
            ed[last] = ed.pop(last)
    return _LOGFMT(logger, name, ed)


def logfmt_line(event_dict: Mapping[str, Any]) -> str:
    """One event dict as the logfmt line the daemon prints."""
    return render_logfmt(None, "", event_dict)


class _DropBenignWatchdogRace(logging.Filter):
    # watchdog logs this at ERROR when an inotify observer is stopped while an event is in
    # flight (a race inside the library, harmless: we stop tailers between attempts).
    def filter(self, record: logging.LogRecord) -> bool:
        return "called when the thread is inactive" not in record.getMessage()


def quiet_library_logs() -> None:
    """Libraries that log through the standard logging module (watchdog's threads) must not print
    stray lines between our events: only their real errors, in logging's default format."""
    lg = logging.getLogger("watchdog")
    lg.setLevel(logging.ERROR)
    if not any(isinstance(f, _DropBenignWatchdogRace) for f in lg.filters):
        for name in ("watchdog", "watchdog.observers.inotify", "watchdog.observers.inotify_buffer"):
            logging.getLogger(name).addFilter(_DropBenignWatchdogRace())


def console_quiet(_logger: Any, _name: str, ed: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Drops what a terminal at the default level does not say (:func:`narration.said_at_default`)."""
    if not said_at_default(ed):
        raise structlog.DropEvent
    return ed


def add_processor(proc: Processor) -> None:
    """Insert an extra processor before rendering (the journal sender uses this)."""
    _extra.append(proc)


def configure(fmt: str = "auto", level: str = "info", stream: TextIO | None = None) -> str:
    stream = stream or sys.stderr
    if fmt == "auto":
        if os.environ.get("JOURNAL_STREAM"):
            fmt = "logfmt"
        elif stream.isatty():
            fmt = "console"
        else:
            fmt = "logfmt"
    pre: list[Any] = [structlog.contextvars.merge_contextvars, structlog.processors.add_log_level, drop_none]
    renderer: Any
    if fmt == "console":
        pre.insert(0, structlog.processors.TimeStamper(fmt="%H:%M:%S", key=TIMESTAMP_KEY))
        # The traceback is printed below the sentence (plain text: never locals, which could hold a token).
        pre.append(format_tracebacks)
        renderer = ConsoleRenderer(TIMESTAMP_KEY)
    elif fmt == "json":
        pre.insert(0, structlog.processors.TimeStamper(fmt="iso", utc=True, key=TIMESTAMP_KEY))
        pre.append(format_tracebacks)
        renderer = structlog.processors.JSONRenderer(serializer=strictjson.dumps)  # a NaN value as "NaN"
    else:
        if not os.environ.get("JOURNAL_STREAM"):
            pre.insert(0, structlog.processors.TimeStamper(fmt="iso", utc=True, key=TIMESTAMP_KEY))
        pre.append(format_tracebacks)
        renderer = render_logfmt
    # A terminal at the default level says the narration, warnings and a few events; the rest
    # (state changes, gate passes) stays in the ledger and the journal (the sender is in _extra).
    post: list[Any] = [console_quiet] if fmt == "console" and level == "info" else []
    quiet_library_logs()
    structlog.configure(
        # The gate last before the journal sender and the renderer: it sees the formatted traceback too.
        processors=[*pre, mask_secrets, *_extra, *post, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        # One write per line, through the console line it shares with the job's stderr
        # (job/consoleline.py): an event never lands inside a job's line.
        logger_factory=structlog.WriteLoggerFactory(event_stream(stream)),
        cache_logger_on_first_use=False,
    )
    return fmt
