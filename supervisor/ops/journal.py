"""Native journal entries for the daemon's own events, so ``journalctl TSUP_CAUSE=nan`` works.

Decision (documented in docs/operating.md): under systemd, when stderr is the journal stream
(``$JOURNAL_STREAM`` matches fd 2) and the native socket exists, each daemon event is sent ONCE,
as a native entry:

- ``MESSAGE``: a sentence for people, the event's ``message`` (or ``summary``), then ``; next:``
  and its ``next`` when it has one; an event without either reads ``state changed: old=running
  new=stopping``. A traceback (``log.exception()``, ``exc_info=``) follows on the next lines, so
  ``journalctl -u ...`` shows it where it happened.
- ``MESSAGE_ID``: one 128-bit ID per event kind (:func:`message_id`), fixed per
  :class:`~supervisor.eventnames.EventName` member in :data:`supervisor.eventids.MESSAGE_IDS` (a
  renamed member keeps its ID), so ``journalctl MESSAGE_ID=...`` finds every restart whatever its
  text; a name outside the vocabulary (a library's logger) gets uuid5 of it in :data:`ID_NAMESPACE`.
- ``CODE_FILE``/``CODE_LINE``/``CODE_FUNC``: where in our code the event was decided and logged,
  never a logging helper (:mod:`supervisor.logsite`).
- ``PRIORITY`` (from the level), ``SYSLOG_IDENTIFIER``, ``TSUP_SOURCE=daemon`` (the marker of our
  entries, never overwritten: an event's own ``source`` key, where a detection was seen, is
  ``TSUP_EVENT_SOURCE``), and the data: every structlog key as ``TSUP_<KEY>``
  (``TSUP_EVENT=restart_scheduled``, ``TSUP_CAUSE=nan``, ``TSUP_ATTEMPT=3``, ``TSUP_RUN_ID=...``,
  ``TSUP_EXCEPTION=<traceback>``), each value spelled as everywhere (:func:`supervisor.humanize.value`).

The stderr line is then dropped, so the journal holds each event once. If a send fails the line
goes to stderr as usual (nothing is lost). The job's output is untouched: it is passed through on
stdout. Outside the journal (a terminal, a file, ``wrap`` in a shell) only the stderr lines exist.

Protocol (systemd.journal-fields(7), "native protocol"): one datagram to
/run/systemd/journal/socket; each field is ``NAME=value\\n``, or, when the value contains a
newline, ``NAME\\n`` + the value's length as a little-endian uint64 + the value + ``\\n``.
The memfd path for entries larger than a datagram is not needed: values are capped.
"""
from __future__ import annotations

import os
import re
import socket
import struct
import threading
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import structlog
from ..eventids import MESSAGE_IDS
from ..eventnames import member
from ..humanize import value as spell
from ..logsite import callsite
from ..textescape import Mode, escape

JOURNAL_SOCKET = "/run/systemd/journal/socket"
IDENTIFIER = "transformer-supervisor"
MAX_VALUE = 8 * 1024  # per field; a traceback longer than this is cut (the tail is kept)
MAX_MESSAGE = 16 * 1024

#: MESSAGE_ID of a name outside the vocabulary = uuid5(ID_NAMESPACE, name); the vocabulary's IDs
#: were made the same way once and are kept in supervisor/eventids.py.
ID_NAMESPACE = uuid.UUID("ecf9f241-035c-5c8d-b1f8-9b1dd5a64156")  # uuid5(NAMESPACE_DNS, "transformer-supervisor.events")
# Keys that become journal fields of their own (not TSUP_*) or are the entry's timestamp.
_META = frozenset({"ts", "timestamp", "exc_info", "stack_info"})

# syslog priorities (journalctl -p): structlog level -> PRIORITY
PRIORITIES = {"debug": 7, "info": 6, "notice": 5, "warning": 4, "warn": 4, "error": 3,
              "exception": 3, "critical": 2, "fatal": 2}

_FIELD_BAD = re.compile(r"[^A-Z0-9_]")

#: the field every entry of ours carries (``journalctl TSUP_SOURCE=daemon``: the daemon's events
#: without the job's output)
MARKER = "TSUP_SOURCE"
#: an event's own key that would land on the marker's field goes here instead (a detection's
#: ``source``: output, nvml, heartbeat, host; a quarantine's source path)
_RENAMED = {MARKER: "TSUP_EVENT_SOURCE"}

def field_name(key: str) -> str:
    """``run_id`` -> ``TSUP_RUN_ID``: uppercase, only A-Z 0-9 _, at most 64 bytes (journald's rules;
    a user field may not start with ``_``, which the prefix guarantees)."""
    return ("TSUP_" + _FIELD_BAD.sub("_", key.upper()))[:64]


def field_value(value: Any) -> str | None:
    """A field's text, spelled as in every output (enums by value, booleans as true/false,
    containers as compact JSON); None: omit."""
    return None if value is None else spell(value)


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


def message_id(event: str) -> str:
    """The journal MESSAGE_ID of an event kind: 32 lowercase hex digits (``journalctl
    MESSAGE_ID=...``): the member's fixed ID, else uuid5 of the name."""
    known = member(event)
    return MESSAGE_IDS[known] if known is not None else uuid.uuid5(ID_NAMESPACE, event).hex


def _traceback_text(event_dict: Mapping[str, Any]) -> str | None:
    exc = event_dict.get("exception")
    if isinstance(exc, str) and exc:
        return exc
    if event_dict.get("exc_info"):
        import structlog.processors as sp

        formatted = sp.ExceptionRenderer()(None, "", {"exc_info": event_dict["exc_info"]})
        return formatted.get("exception") or None
    return None


def sentence(event_dict: Mapping[str, Any]) -> str:
    """The human MESSAGE of an event: its ``message`` (or ``summary``), then its ``next``; an event
    with neither: ``state changed: old=running new=stopping``."""
    text = event_dict.get("message") or event_dict.get("summary")
    nxt = event_dict.get("next")
    if text:
        out = str(text)
        if nxt:
            out += f"; next: {nxt}"
        return out
    ev = str(event_dict.get("event") or "event").replace("_", " ")
    skip = _META | {"event", "level", "message", "summary", "next", "exception", "stack", "run_id"}
    data = {k: v for k, v in event_dict.items() if k not in skip and v is not None}
    from ..logsetup import logfmt_line

    out = f"{ev}: {logfmt_line(data)}" if data else ev
    if nxt:
        out += f"; next: {nxt}"
    return out


def entry_fields(event_dict: Mapping[str, Any], message: str | None = None, level: str | None = None,
                 code: tuple[str, int, str] | None = None) -> dict[str, str]:
    """The journal fields for one structlog event: MESSAGE (``message``, or :func:`sentence`; the
    traceback on the lines after it), MESSAGE_ID, PRIORITY, CODE_* (``code``: file, line,
    function), and the data as TSUP_* fields."""
    lvl = str(event_dict.get("level") or level or "info").lower()
    tb = _traceback_text(event_dict)
    text = sentence(event_dict) if message is None else message
    if tb and tb not in text:
        text = f"{text}\n{tb.rstrip()}"
    fields: dict[str, str] = {
        "MESSAGE": escape(text, Mode.FIELD),  # a job's ESC or bidi control escaped, its lines kept
        "PRIORITY": str(PRIORITIES.get(lvl, 6)),
        "SYSLOG_IDENTIFIER": IDENTIFIER,
    }
    if event_dict.get("event"):
        fields["MESSAGE_ID"] = message_id(str(event_dict["event"]))
    if code is not None:
        fields["CODE_FILE"], fields["CODE_LINE"], fields["CODE_FUNC"] = code[0], str(code[1]), code[2]
    for key, value in event_dict.items():
        if key in _META:
            continue
        text_value = field_value(value)
        if text_value is not None:
            name = field_name(str(key))
            fields[_RENAMED.get(name, name)] = escape(text_value, Mode.FIELD)
    if tb and "TSUP_EXCEPTION" not in fields:
        fields["TSUP_EXCEPTION"] = escape(tb, Mode.FIELD)
    fields[MARKER] = "daemon"  # last: no key of the event can take the filter's field
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
    return (sender or _default_sender).send(entry_fields(event_dict, message, code=callsite(2)))


class JournalProcessor:
    """A structlog processor placed just BEFORE the renderer (``logsetup.add_processor``).

    It builds the entry (MESSAGE from ``message`` called with the event dict, default
    :func:`sentence`; the fields from :func:`entry_fields`), sends it as one native journal entry
    and drops the event (``structlog.DropEvent``), so stderr does not carry it a second time. If
    the send fails it returns the event unchanged and the renderer writes it to stderr as usual:
    nothing is lost.

    Wiring: ``p = JournalProcessor.for_environment(enabled=cfg.systemd.journal_fields)``;
    ``if p: logsetup.add_processor(p)`` (None when stderr is not the journal or no socket).
    """

    def __init__(self, message: Callable[[Mapping[str, Any]], str] | None = None,
                 sender: JournalSender | None = None) -> None:
        self.message = message or sentence
        self.sender = sender or _default_sender

    @classmethod
    def for_environment(cls, message: Callable[[Mapping[str, Any]], str] | None = None, *, enabled: bool = True,
                        env: Mapping[str, str] | None = None,
                        socket_path: str = JOURNAL_SOCKET) -> "JournalProcessor | None":
        sender = JournalSender(socket_path)
        if enabled and stderr_is_journal(env) and sender.available():
            return cls(message, sender)
        return None

    def __call__(self, logger: Any, method_name: str, event_dict: "structlog.typing.EventDict") -> Any:
        text = self.message(dict(event_dict))
        if self.sender.send(entry_fields(event_dict, text, method_name, code=callsite(2))):
            raise structlog.DropEvent
        return event_dict
