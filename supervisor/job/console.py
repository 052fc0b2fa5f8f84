"""The job's bytes passed through to our console: each stream to its own (:class:`Consoles`),
through a :class:`ConsoleWriter`, which never blocks the job. Apart from the output path
(:mod:`.output`) because a console that stops reading is a concern of its own: a writer thread,
back pressure, and what a stall drops and later owns up to.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass
from typing import BinaryIO, Callable, Protocol

from .consoleline import SharedLine


class Console(Protocol):
    """Where the job's bytes are passed through (our stdout): must never block the caller."""

    def offer(self, chunk: bytes) -> None: ...


@dataclass(frozen=True)
class Consoles:
    """Where each of the job's streams is passed through; None: not shown (job.log has it)."""

    out: Console | None
    err: Console | None


class ConsoleWriter:
    """The job's output to our stdout, from a thread of its own, never blocking the pumps.

    A terminal that stops reading (Ctrl-S, a full pipe into ``less``, an ssh session gone quiet)
    must not stall the job (its pipe would fill and its prints block: a false ``hang``), nor the
    main loop. The pumps ``offer`` chunks; this thread writes them. A console that reads, however
    slowly, gets every byte: with more than ``limit`` bytes waiting, ``offer`` waits for room (back
    pressure, as a terminal gives). Only a console that has taken nothing for ``stall_s`` is
    treated as stopped: new chunks are then dropped and counted (the job log file keeps every
    byte), and once it reads again a line says how much it missed. So the job waits at most
    ``stall_s`` once per stall, far below any hang timeout. ``close`` waits at most its timeout.
    With a ``line`` (the one our event lines share, :mod:`.consoleline`), each write holds it
    and says whether the job's line was left open, so an event line never lands inside it.
    """

    def __init__(self, stream: BinaryIO, limit: int = 8 << 20, stall_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic, line: SharedLine | None = None) -> None:
        self.stream = stream
        self.line = line
        self.limit = limit
        self.stall_s = stall_s
        self._clock = clock
        self._progress_at = clock()
        self.dropped_bytes = 0
        self.dropped_chunks = 0
        self.broken = False
        self._queue: collections.deque[bytes] = collections.deque()
        self._queued = 0
        self._unreported = 0
        self._cv = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="console-writer", daemon=True)
        self._thread.start()

    def offer(self, chunk: bytes) -> None:
        with self._cv:
            if self.broken or self._closing:
                return
            while self._queued and self._queued + len(chunk) > self.limit:
                stalled_for = self._clock() - self._progress_at
                if stalled_for >= self.stall_s:
                    self.dropped_bytes += len(chunk)
                    self.dropped_chunks += 1
                    self._unreported += len(chunk)
                    return
                self._cv.wait(min(0.1, self.stall_s - stalled_for))
                if self.broken or self._closing:
                    return
            self._queue.append(chunk)
            self._queued += len(chunk)
            self._cv.notify()

    def pending(self) -> int:
        with self._cv:
            return self._queued

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closing:
                    self._cv.wait()
                if not self._queue:
                    return
                self._progress_at = self._clock()  # a write starts: a stall is counted from here
                chunk = self._queue.popleft()
                self._queued -= len(chunk)
                missed, self._unreported = self._unreported, 0
            try:
                if self.line is not None:
                    with self.line.job_write(chunk) as shown:
                        self._write(shown, missed)
                else:
                    self._write(chunk, missed)
                with self._cv:
                    self._progress_at = self._clock()
                    self._cv.notify_all()
            except (OSError, ValueError):
                with self._cv:  # our stdout went away: stop passing through, keep the log file
                    self.broken = True
                    self._queue.clear()
                    self._queued = 0
                return

    def _write(self, chunk: bytes, missed: int) -> None:
        if missed:
            self.stream.write(f"\n[transformer-supervisor: {missed} bytes of the job's output were not "
                              "shown here because this console stopped reading; job.log has them all]\n"
                              .encode())
        self.stream.write(chunk)
        self.stream.flush()

    def close(self, timeout: float = 2.0) -> None:
        with self._cv:
            self._closing = True
            self._cv.notify()
        self._thread.join(timeout)
