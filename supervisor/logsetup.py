"""structlog set-up: one event per line on stderr, ``event=<name>``.

Console (colours, timestamps) on a TTY; logfmt key=value lines *without* timestamps under the
journal (``JOURNAL_STREAM`` set: journald stamps them); JSON on request. Values whose key names a
secret are masked before any renderer sees them.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Callable, MutableMapping, TextIO

import structlog

from .process import is_secret

Processor = Callable[[Any, str, MutableMapping[str, Any]], Any]
_extra: list[Processor] = []


def _mask_secrets(_logger: Any, _name: str, ed: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for k in list(ed):
        if k != "event" and is_secret(k):
            ed[k] = "<redacted>"
    return ed


def _logfmt_value(v: Any) -> str:
    s = str(v)
    if s == "" or any(c in s for c in ' ="\n\\'):
        s = '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return s


def _logfmt(_logger: Any, _name: str, ed: MutableMapping[str, Any]) -> str:
    # event first, message last: a human scanning the journal reads "event=... msg".
    parts = [f"event={_logfmt_value(ed.pop('event', ''))}"]
    if "level" in ed:
        parts.append(f"level={ed.pop('level')}")
    msg = ed.pop("message", None)
    for k, v in ed.items():
        parts.append(f"{k}={_logfmt_value(v)}")
    if msg is not None:
        parts.append(f"message={_logfmt_value(msg)}")
    return " ".join(parts)


def _json_event(_logger: Any, _name: str, ed: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    return ed


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
    pre: list[Any] = [structlog.contextvars.merge_contextvars, structlog.processors.add_log_level, _mask_secrets]
    renderer: Any
    if fmt == "console":
        pre.insert(0, structlog.processors.TimeStamper(fmt="%H:%M:%S"))
        renderer = structlog.dev.ConsoleRenderer(colors=stream.isatty())
    elif fmt == "json":
        pre.insert(0, structlog.processors.TimeStamper(fmt="iso", utc=True))
        renderer = structlog.processors.JSONRenderer()
    else:
        if not os.environ.get("JOURNAL_STREAM"):
            pre.insert(0, structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"))
        renderer = _logfmt
    quiet_library_logs()
    structlog.configure(
        processors=[*pre, *_extra, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )
    return fmt
