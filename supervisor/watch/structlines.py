"""Structured log lines whose metrics are in the message text, not in keys of their own.

loguru with ``serialize=True`` writes ``{"text": "... - step 10 loss=nan\\n", "record": {"message":
"step 10 loss=nan", ...}}``; structlog's JSON renderer ``{"event": "step 10 loss=nan", "level":
"info", ...}``; python-json-logger ``{"message": "...", "levelname": ...}``. No key of these objects
is a metric, so the JSON reader finds no record; the message is an ordinary log line and goes to
the line parsers. loguru's ``record.extra`` (``logger.bind(loss=...)``) holds metrics in keys: read
as a JSON line's keys are, the step from them or from the message. Pure functions.
"""

from __future__ import annotations

import json
from typing import Mapping

# The message field of each structured logger, most specific first: loguru's record.message (its
# "text" also holds the formatted prefix), then python-json-logger / stdlib ("message", "msg"),
# structlog ("event").
MESSAGE_KEYS = ("message", "msg", "event", "text")


def message_of(obj: Mapping[str, object]) -> str | None:
    """The message text of a structured log record, or None."""
    rec = obj.get("record")
    if isinstance(rec, dict):
        msg = rec.get("message")
        if isinstance(msg, str) and msg.strip():
            return msg.strip()
    for key in MESSAGE_KEYS:
        msg = obj.get(key)
        if isinstance(msg, str) and msg.strip():
            return msg.strip()
    return None


def json_parts(line: str) -> tuple[str | None, dict[str, object] | None]:
    """The message of a JSON log line (as :func:`json_message`) and loguru's ``record.extra`` (what
    ``logger.bind(loss=...)`` or ``logger.info(..., loss=...)`` adds: metrics in keys of their own,
    beside a message such as ``step 25``), each None when absent."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return None, None
    if not isinstance(obj, dict):
        return None, None
    msg = message_of(obj)
    rec = obj.get("record")
    extra = rec.get("extra") if isinstance(rec, dict) else None
    return (None if msg is None or msg.startswith("{") else msg), (extra if isinstance(extra, dict) and extra else None)


def json_message(line: str) -> str | None:
    """The message of a JSON log line (the caller has bounded its length), or None. A message that
    is itself JSON is not unwrapped again (one level: no recursion on crafted input)."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    msg = message_of(obj)
    if msg is None or msg.startswith("{"):
        return None
    return msg


__all__ = ["MESSAGE_KEYS", "json_message", "json_parts", "message_of"]
