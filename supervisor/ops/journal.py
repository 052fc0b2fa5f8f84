"""Native journal entries for the daemon's own events, so ``journalctl TSUP_CAUSE=nan`` works.

Decision (documented in docs/operating.md): under systemd, when stderr is the journal stream
(``$JOURNAL_STREAM`` matches fd 2) and the native socket exists, each daemon event is sent ONCE,
as a native entry whose MESSAGE is the very same ``event=... key=value`` line the stderr renderer
would have printed, plus fields: PRIORITY (from the level), SYSLOG_IDENTIFIER, TSUP_SOURCE=daemon
and every structlog key as ``TSUP_<KEY>`` (``TSUP_EVENT=restart``, ``TSUP_CAUSE=nan``,
``TSUP_ATTEMPT=3``, ``TSUP_RUN_ID=...``). The stderr line is then dropped, so the journal holds each
event once, greppable as text and matchable by field. If a send fails the line goes to stderr as
usual (nothing is lost). The job's output is untouched: it is passed through on stdout.
Outside the journal (a terminal, a file, ``wrap`` in a shell) only the stderr lines exist.

Protocol (systemd.journal-fields(7), "native protocol"): one datagram to
/run/systemd/journal/socket; each field is ``NAME=value\\n``, or, when the value contains a
newline, ``NAME\\n`` + the value's length as a little-endian uint64 + the value + ``\\n``.
The memfd path for entries larger than a datagram is not needed: values are capped.
"""
from __future__ import annotations

import enum
import json
import os
import re
import socket
import struct
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import structlog

JOURNAL_SOCKET = "/run/systemd/journal/socket"
IDENTIFIER = "transformer-supervisor"
MAX_VALUE = 8 * 1024  # per field; a traceback longer than this is cut (the tail is kept)
MAX_MESSAGE = 16 * 1024

# syslog priorities (journalctl -p): structlog level -> PRIORITY
PRIORITIES = {"debug": 7, "info": 6, "notice": 5, "warning": 4, "warn": 4, "error": 3,
              "exception": 3, "critical": 2, "fatal": 2}

_FIELD_BAD = re.compile(r"[^A-Z0-9_]")

Renderer = Callable[[Any, str, "structlog.typing.EventDict"], Any]


def field_name(key: str) -> str:
    """``run_id`` -> ``TSUP_RUN_ID``: uppercase, only A-Z 0-9 _, at most 64 bytes (journald's rules;
    a user field may not start with ``_``, which the prefix guarantees)."""
    return ("TSUP_" + _FIELD_BAD.sub("_", key.upper()))[:64]


def field_value(value: Any) -> str | None:
    """A field's text: enums by value, booleans as true/false, containers as JSON; None: omit."""
    if value is None:
        return None
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    try:
        return json.dumps(value, default=str, sort_keys=True)
    except (TypeError, ValueError):
        return str(value)


def _cap(value: bytes, limit: int) -> bytes:
    return value if len(value) <= limit else b"[...]" + value[-limit:]


def encode(fields: Mapping[str, str | bytes]) -> bytes:
    """Serialize fields for the native protocol (binary-safe form for values with a newline)."""
    out = bytearray()
    for name, value in fields.items():
        raw = value if isinstance(value, bytes) else value.encode("utf-8", "replace")
        raw = _cap(raw, MAX_MESSAGE if name == "MESSAGE" else MAX_VALUE)
        key = name.encode("ascii")
        if b"\n" in raw:
            out += key + b"\n" + struct.pack("<Q", len(raw)) + raw + b"\n"
        else:
            out += key + b"=" + raw + b"\n"
    return bytes(out)


def entry_fields(event_dict: Mapping[str, Any], message: str, level: str | None = None) -> dict[str, str]:
    """The journal fields for one structlog event (MESSAGE is the rendered line)."""
    lvl = str(event_dict.get("level") or level or "info").lower()
    fields: dict[str, str] = {
        "MESSAGE": message,
        "PRIORITY": str(PRIORITIES.get(lvl, 6)),
        "SYSLOG_IDENTIFIER": IDENTIFIER,
        "TSUP_SOURCE": "daemon",
    }
    for key, value in event_dict.items():
        text = field_value(value)
        if text is not None:
            fields[field_name(str(key))] = text
    return fields


def stderr_is_journal(env: Mapping[str, str] | None = None, fd: int = 2) -> bool:
    """True when ``fd`` is the stream systemd connected to the journal (``$JOURNAL_STREAM`` is
    ``DEV:INODE`` of it); a daemon whose stderr was redirected elsewhere is not "in the journal"."""
    env = os.environ if env is None else env
    dev, _, ino = env.get("JOURNAL_STREAM", "").partition(":")
    if not (dev.isdigit() and ino.isdigit()):
        return False
    try:
        st = os.fstat(fd)
    except OSError:
        return False
    return st.st_dev == int(dev) and st.st_ino == int(ino)


class JournalSender:
    """Sends entries to journald's native socket. Thread-safe; never raises."""

    def __init__(self, socket_path: str = JOURNAL_SOCKET) -> None:
        self.socket_path = socket_path
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    def available(self) -> bool:
        return Path(self.socket_path).exists()

    def send(self, fields: Mapping[str, str | bytes]) -> bool:
        data = encode(fields)
        with self._lock:
            try:
                if self._sock is None:
                    self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.sendto(data, self.socket_path)
                return True
            except OSError:
                return False  # the caller falls back to the stderr line

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None


_default_sender = JournalSender()


def send(event_dict: Mapping[str, Any], message: str | None = None, sender: JournalSender | None = None) -> bool:
    """Send one structlog event dict as a native journal entry; True when it was accepted."""
    if message is None:
        message = logfmt(event_dict)
    return (sender or _default_sender).send(entry_fields(event_dict, message))


def logfmt(event_dict: Mapping[str, Any]) -> str:
    """``event=NAME key=value ...`` (values with spaces, quotes or newlines quoted), the MESSAGE
    used when no renderer is given; the same shape as the daemon's stderr lines."""
    def fmt(v: Any) -> str:
        s = field_value(v) or ""
        if s == "" or any(c in s for c in ' ="\n\\'):
            s = '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
        return s
    parts = [f"event={fmt(event_dict.get('event', ''))}"]
    parts += [f"{k}={fmt(v)}" for k, v in event_dict.items() if k != "event" and v is not None]
    return " ".join(parts)


class JournalProcessor:
    """A structlog processor placed just BEFORE the renderer (``logsetup.add_processor``).

    It renders the event's line (with ``renderer`` on a copy of the event dict, or
    :func:`logfmt`), sends it with its fields as one native journal entry and drops the event
    (``structlog.DropEvent``), so stderr does not carry it a second time. If the send fails it
    returns the event unchanged and the renderer writes it to stderr as usual: nothing is lost.

    Wiring: ``p = JournalProcessor.for_environment(renderer, enabled=cfg.systemd.journal_fields)``;
    ``if p: logsetup.add_processor(p)`` (None when stderr is not the journal or no socket).
    """

    def __init__(self, renderer: Renderer | None = None, sender: JournalSender | None = None) -> None:
        self.renderer = renderer
        self.sender = sender or _default_sender

    @classmethod
    def for_environment(cls, renderer: Renderer | None = None, *, enabled: bool = True,
                        env: Mapping[str, str] | None = None,
                        socket_path: str = JOURNAL_SOCKET) -> "JournalProcessor | None":
        sender = JournalSender(socket_path)
        if enabled and stderr_is_journal(env) and sender.available():
            return cls(renderer, sender)
        return None

    def __call__(self, logger: Any, method_name: str, event_dict: "structlog.typing.EventDict") -> Any:
        if self.renderer is not None:
            line = self.renderer(logger, method_name, dict(event_dict))  # renderers may pop keys
            message = line.decode("utf-8", "replace") if isinstance(line, bytes) else str(line)
        else:
            message = logfmt(event_dict)
        if self.sender.send(entry_fields(event_dict, message, method_name)):
            raise structlog.DropEvent
        return event_dict
