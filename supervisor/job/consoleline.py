"""The one console line the job's output and our event lines share: an event never splits a job line.

The job's stderr is passed through to our stderr, where structlog writes the daemon's event
lines too (and on a terminal the job's stdout shares the screen with both). Without care an
event line lands in the middle of a job's line: ``epoch 3: 45%|####    event=hang_suspected ...
| 450/1000``. So every write of a sharing :class:`~supervisor.job.console.ConsoleWriter` holds
:class:`SharedLine` and records whether it left the job's line open; an event line written
while it is open starts with a newline (the job's line ends where it was, the event stands on a
line of its own, the job's next bytes go on below). A newline first, rather than holding the
event until the job's line ends: a progress bar may never end its line, and an event held back
is an event late.

The event side waits for the lock at most ``wait_s`` (a console writer blocked on a terminal
that stopped reading holds it): the event is then written anyway, as it would have been before.
"""

from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager
from typing import Any, BinaryIO, Iterator, TextIO


class SharedLine:
    """Who left the shared console line open: the job (mid-line) or nobody."""

    def __init__(self, wait_s: float = 1.0) -> None:
        self.wait_s = wait_s
        self.open = False  # the job's last write ended mid-line
        self.broken = False  # an event ended the job's open line: its own newline is already there
        self.breaks = 0  # newlines put before an event line (said in tests)
        self._lock = threading.Lock()

    @contextmanager
    def job_write(self, chunk: bytes) -> Iterator[bytes]:
        """Around one write of the job's bytes (on the console writer's thread): yields what to
        write. A chunk that starts with the newline of a line an event already ended loses that
        newline (a pipe read can split "loss 1.9" from its "\n": an empty line otherwise)."""
        with self._lock:
            out = chunk[1:] if self.broken and chunk.startswith(b"\n") else chunk
            yield out
            if chunk:
                self.broken = False
                # "\r" leaves the cursor on a bar's line too: an event there would overwrite it.
                self.open = not chunk.endswith(b"\n")

    def event_text(self, text: str) -> str:
        """``text`` as it must be written now (the lock held): a newline first if the job's line is open."""
        if self.open and text:
            self.breaks += 1
            self.open = False
            self.broken = True
            return "\n" + text
        return text

    @contextmanager
    def event_write(self) -> Iterator[None]:
        got = self._lock.acquire(timeout=self.wait_s)
        try:
            yield
        finally:
            if got:
                self._lock.release()


#: fd 2's line: the daemon's events and the job's stderr (and its stdout when fd 1 is the same file)
STDERR_LINE = SharedLine()


class EventStream:
    """Our event lines' stream (structlog's ``WriteLogger`` writes each line in one call): each
    write goes through the shared line. Everything else is the wrapped stream's."""

    def __init__(self, stream: TextIO, line: SharedLine) -> None:
        self.stream = stream
        self.line = line

    def write(self, text: str) -> int:
        with self.line.event_write():
            n = self.stream.write(self.line.event_text(text))
            self.stream.flush()  # before the lock goes: the job's bytes bypass this text buffer
        return n

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def shares_stderr(stream: BinaryIO | TextIO) -> bool:
    """Whether ``stream`` is the file our fd 2 writes to (the same terminal, pipe or file)."""
    try:
        return os.path.samestat(os.fstat(stream.fileno()), os.fstat(sys.stderr.fileno()))
    except (OSError, ValueError, AttributeError):
        return False


def event_stream(stream: TextIO) -> TextIO:
    """``stream`` for our event lines: through :data:`STDERR_LINE` when it writes to our stderr."""
    if stream is sys.stderr or stream is sys.__stderr__:
        return EventStream(stream, STDERR_LINE)  # type: ignore[return-value]
    return stream
