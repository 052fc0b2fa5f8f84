"""torchrun's root cause read from the job's output, for scripts without ``@record`` (most).

Without ``@record`` no worker writes an error file, so torchrun's agent has none to copy into the
attempt's TORCHELASTIC_ERROR_FILE (:mod:`.torchelastic` finds nothing). What is needed is in the
output anyway (torch 2.x, on stderr):

- torchrun's own summary when it gives up, after its ``ChildFailedError`` traceback: the first
  failure's global rank and exit code (a negative code is the signal that killed it)::

      Root Cause (first observed failure):
      [0]:
        time      : 2026-12-07_15:23:56
        host      : localhost
        rank      : 1 (local_rank: 1)
        exitcode  : 1 (pid: 438)
        error_file: <N/A>
        traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
      ============================================================

- that rank's Python traceback, each line prefixed ``[rank1]: `` by the excepthook
  torch.distributed installs (``[default1]:``, the role and *local* rank, with ``--tee``; both
  with both)::

      [rank1]: Traceback (most recent call last):
      [rank1]:   File "/srv/train.py", line 14, in main
      [rank1]:     raise ValueError("boom at step 3")
      [rank1]: ValueError: boom at step 3

:class:`TorchrunOutput` follows one attempt's lines (a :class:`~supervisor.events.LineSink`) and
gives a root cause only when torchrun's summary was seen: the rank and exit code from it, the
exception and last frame from the traceback of that rank (global prefix, else local prefix, else
the one unprefixed worker traceback when there was exactly one: with several, which rank printed
which is unknown, and none is named). accelerate and deepspeed's elastic launches print the same.

Bounded whatever the job prints: a line is cut at :data:`~supervisor.redact.MAX_LINE_CHARS`
before any regex (each linear), a traceback keeps only its last frame and its exception line, at
most :data:`MAX_TRACES` prefixes are followed, and a line costs a few ``startswith`` unless it is
part of a traceback or the summary. What it returns passes the redactor (it goes to the log, the
ledger, ``history`` and the report).
"""
from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from typing import Sequence

from ..redact import MAX_LINE_CHARS, MAX_VALUE_CHARS, redact_line
from .torchelastic import FRAME, RootCause

#: prefixes (ranks) whose tracebacks are followed; more ranks than this on one node is not a job
MAX_TRACES = 1024
#: lines of torchrun's summary read after its "Root Cause" line (it has 8)
SUMMARY_LINES = 16

_PREFIX = re.compile(r"\[(?P<role>[A-Za-z_][A-Za-z_-]*)(?P<n>\d{1,7})\]:[ ]?")
_EXC = re.compile(r"(?P<type>[A-Za-z_][\w.]*)(?::[ ]?(?P<msg>.*))?$")
_RANK = re.compile(r"\s*rank\s*:\s*(?P<rank>-?\d{1,9})")
_EXITCODE = re.compile(r"\s*exitcode\s*:\s*(?P<code>-?\d{1,9})")
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
#: the agent's own tracebacks (it re-raises the workers' failure; a stop's signal): never a worker's
_AGENT_EXCEPTIONS = ("ChildFailedError", "SignalException")


@dataclass
class _Trace:
    active: bool = True
    frame: str | None = None  # the last "File ..., line N, in f" seen: where it was raised
    raised: tuple[str, str, str | None] | None = None  # (type, message, last frame) once it ended


@dataclass
class _Summary:
    rank: int | None = None
    local: int | None = None
    code: int | None = None
    lines_left: int = SUMMARY_LINES
    done: bool = field(default=False)


def _split(line: str) -> tuple[str, str]:
    """(the prefix's key, the rest): ``rank:1`` for ``[rank1]:``, ``local:1`` for ``[default1]:``,
    "" for none; of two (``--tee`` and the excepthook), the global rank's."""
    key = ""
    for _ in range(2):
        m = _PREFIX.match(line)
        if m is None:
            break
        key = f"rank:{int(m['n'])}" if m["role"] == "rank" else (key or f"local:{int(m['n'])}")
        line = line[m.end():]
    return key, line


class TorchrunOutput:
    """One attempt's output: torchrun's summary and the workers' tracebacks (thread-safe: the
    stdout and stderr pumps feed it, the main loop asks :meth:`root_cause` after the exit)."""

    def __init__(self, log_file: str = "") -> None:
        self.log_file = log_file  # where a human reads the whole traceback
        self._lock = threading.Lock()
        self._traces: dict[tuple[str, str], _Trace] = {}
        self._plain: list[tuple[str, str, str | None]] = []  # unprefixed worker tracebacks (at most 2 kept)
        self._summary: _Summary | None = None
        self._found: _Summary | None = None

    def feed(self, source: str, lines: Sequence[str]) -> None:
        if source not in ("stdout", "stderr"):
            return
        with self._lock:
            for line in lines:
                self._line(source, line[:MAX_LINE_CHARS])

    def _line(self, source: str, line: str) -> None:
        key, body = _split(line) if line.startswith("[") else ("", line)
        if not key and self._in_summary(body):
            return
        slot = (source, key)
        if body.startswith("Traceback (most recent call last):"):
            if slot in self._traces or len(self._traces) < MAX_TRACES:
                self._traces[slot] = _Trace()
            return
        trace = self._traces.get(slot)
        if trace is None or not trace.active:
            return  # most lines: no copy of them made
        body = body.rstrip()
        if not body:
            return
        if body[0] in " \t":
            m = FRAME.match(body)
            if m is not None:
                trace.frame = f"{m['file']}:{m['line']} in {m['func']}"
            return
        if body.startswith(_CHAINED):
            return  # the next "Traceback" line starts the exception that counts
        m = _EXC.match(body)
        if m is None:
            return  # another process's line between two of the traceback's (no prefix to tell)
        trace.active = False
        trace.raised = (m["type"], (m["msg"] or "")[:MAX_VALUE_CHARS], trace.frame)
        if not key and not m["type"].endswith(_AGENT_EXCEPTIONS):
            self._plain = [*self._plain[-1:], trace.raised]

    def _in_summary(self, body: str) -> bool:
        """torchrun's summary lines (unprefixed: the agent's own); True when ``body`` was one."""
        s = self._summary
        if s is None or s.done:
            if not body.startswith("Root Cause (first observed failure)"):
                return False
            self._summary = _Summary()
            return True
        s.lines_left -= 1
        if body.startswith("====") or s.lines_left <= 0:
            s.done = True
            return True
        m = _RANK.match(body)
        if m is not None:
            s.rank = int(m["rank"])
            local = re.search(r"local_rank:\s*(\d{1,9})", body[:200])
            s.local = int(local[1]) if local else None
        m = _EXITCODE.match(body)
        if m is not None:
            s.code = int(m["code"])
        if s.rank is not None and s.code is not None:
            self._found = s
        return True

    def root_cause(self) -> RootCause | None:
        """The failing rank, its exit code and, when its traceback was in the output, its exception
        and last frame; None unless torchrun's summary named a rank and an exit code."""
        with self._lock:
            s = self._found
            if s is None or s.rank is None:
                return None
            raised = self._raised(f"rank:{s.rank}") or (self._raised(f"local:{s.local}") if s.local is not None
                                                         else None)
            if raised is None and len(self._plain) == 1:
                raised = self._plain[0]
            rank, code = s.rank, s.code
        exc_type, message, frame = raised if raised is not None else ("", "", None)
        return RootCause(redact_line(exc_type, limit=200), redact_line(message, limit=MAX_VALUE_CHARS),
                         redact_line(frame, limit=MAX_VALUE_CHARS) if frame else None, rank, code,
                         self.log_file, source="output")

    def _raised(self, key: str) -> tuple[str, str, str | None] | None:
        for source in ("stderr", "stdout"):
            trace = self._traces.get((source, key))
            if trace is not None and trace.raised is not None:
                return trace.raised
        return None
