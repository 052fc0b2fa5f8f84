"""Pumping the job's stdout/stderr: pass-through, log file copy, and lines for the monitors.

One thread per pipe reads large chunks as soon as they arrive, so the job never blocks on a full
pipe buffer while we parse. Bytes go to the daemon's stdout unchanged and to the job log file;
only complete lines (decoded as UTF-8 with replacement, capped in length) go to the sinks.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from typing import BinaryIO, Callable, Protocol, Sequence

import structlog

from ..events import LineSink

log = structlog.get_logger("supervisor.job.output")

CHUNK = 1 << 16
MAX_LINE = 64 * 1024  # longer lines are cut (head kept): a 10 MB line costs bounded memory


class SinkFanout:
    """Offers line batches to every registered sink; a failing sink is reported once and dropped."""

    def __init__(self) -> None:
        self._sinks: list[LineSink] = []
        self._lock = threading.Lock()

    def add(self, sink: LineSink) -> None:
        with self._lock:
            self._sinks = [*self._sinks, sink]

    def remove(self, sink: LineSink) -> None:
        with self._lock:
            self._sinks = [s for s in self._sinks if s is not sink]

    def feed(self, source: str, lines: Sequence[str]) -> None:
        for sink in self._sinks:  # copy-on-write list: safe without the lock
            try:
                sink.feed(source, lines)
            except Exception as e:  # a monitor must never take the pump down
                log.error("monitor_failed", monitor=type(sink).__name__, error=repr(e),
                          message=f"line monitor {type(sink).__name__} raised {e!r}; it is disabled, "
                                  "the job keeps running and its output is still passed through")
                self.remove(sink)


TRUNCATED_MARKER = " ...[line truncated]"


class Console(Protocol):
    """Where the job's bytes are passed through (our stdout): must never block the caller."""

    def offer(self, chunk: bytes) -> None: ...


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
    """

    def __init__(self, stream: BinaryIO, limit: int = 8 << 20, stall_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream
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
                if missed:
                    self.stream.write(f"\n[transformer-supervisor: {missed} bytes of the job's output were not "
                                      "shown here because this console stopped reading; job.log has them all]\n"
                                      .encode())
                self.stream.write(chunk)
                self.stream.flush()
                with self._cv:
                    self._progress_at = self._clock()
                    self._cv.notify_all()
            except (OSError, ValueError):
                with self._cv:  # our stdout went away: stop passing through, keep the log file
                    self.broken = True
                    self._queue.clear()
                    self._queued = 0
                return

    def close(self, timeout: float = 2.0) -> None:
        with self._cv:
            self._closing = True
            self._cv.notify()
        self._thread.join(timeout)


class LineSplitter:
    """Bytes -> complete decoded lines, keeping the partial tail; caps line length.

    The one splitter for pipes and tailed files. Whole chunks are decoded and split at once (C
    speed); UTF-8 errors become U+FFFD. A carriage return ends a line as a newline does: a tqdm
    progress bar redraws itself with ``\r`` and never prints ``\n`` while training, so without
    this its updates (the only sign of progress some trainers give) would pile up in one
    unterminated line until the run ends. ``\r\n`` is one terminator, and the blank segments a
    bar leaves when it clears itself are dropped. The log file copy is made from the raw bytes,
    not from these lines, so it stays byte-exact. A line longer than ``max_line`` bytes is
    delivered once, cut, with TRUNCATED_MARKER, and the rest of it skipped, so the held tail never
    exceeds ``max_line`` (a 10 MB line costs bounded memory).
    """

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.max_line = max_line
        self._tail = b""
        self._dropping = False  # inside an over-long line: skip until its terminator
        self._after_cr = False  # the last chunk ended in \r: a leading \n completes that \r\n
        self._provisional: str | None = None  # a held bar redraw already delivered (see push)
        self.truncated = 0

    @property
    def pending(self) -> int:
        return len(self._tail)

    def _cut(self, head: bytes | str) -> str:
        self.truncated += 1
        text = head.decode("utf-8", "replace") if isinstance(head, bytes) else head
        return text[: self.max_line] + TRUNCATED_MARKER

    def _hold(self, tail: bytes, out: list[str]) -> None:
        if len(tail) > self.max_line:
            out.append(self._cut(tail[: self.max_line]))
            self._dropping = True
            tail = b""
        self._tail = tail

    def push(self, chunk: bytes) -> list[str]:
        if self._after_cr and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._after_cr = False
        data = self._tail + chunk if self._tail else chunk
        cut = data.rfind(b"\n")
        has_cr = b"\r" in data
        if has_cr:
            cut = max(cut, data.rfind(b"\r"))
        out: list[str] = []
        if cut < 0:
            if self._dropping:
                self._tail = b""
            else:
                self._hold(data, out)
            return out
        complete, tail = data[:cut], data[cut + 1:]
        if has_cr:
            self._after_cr = data[cut:cut + 1] == b"\r" and not tail
            if complete.endswith(b"\r") and data[cut:cut + 1] == b"\n":
                complete = complete[:-1]  # \r\n: one terminator
            text = complete.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
            lines = text.split("\n")
            if self._dropping:
                lines = lines[1:]  # the rest of the over-long line
                self._dropping = False
            # Blank segments are a progress bar clearing its line, not output worth a batch slot.
            lines = [x for x in lines if x.strip()]
        else:
            lines = complete.decode("utf-8", "replace").split("\n")
            if self._dropping:
                lines = lines[1:]  # the rest of the over-long line
                self._dropping = False
        if len(complete) > self.max_line:
            lines = [x if len(x) <= self.max_line else self._cut(x) for x in lines]
        if self._provisional is not None:
            if lines and lines[0] == self._provisional:
                lines = lines[1:]  # delivered already, when it was the held redraw
            self._provisional = None
        out.extend(lines)
        self._hold(tail, out)
        if has_cr and tail and data[cut:cut + 1] == b"\r" and not self._dropping and b"\n" not in tail:
            # A progress bar writes "\r<bar>" and no terminator until its next redraw: the held
            # tail is the bar as the terminal shows it now, and it may be the last thing a hung
            # job ever prints. Deliver it now; the same text completed later is not repeated.
            self._provisional = tail.decode("utf-8", "replace")
            if self._provisional.strip():
                out.append(self._provisional)
        return out

    def flush(self) -> list[str]:
        tail, self._tail = self._tail, b""
        dropping, self._dropping = self._dropping, False
        self._after_cr = False
        provisional, self._provisional = self._provisional, None
        if tail and not dropping:
            text = tail.decode("utf-8", "replace")
            return [] if text == provisional else [text]
        return []


class PipePump(threading.Thread):
    """Reads one pipe until EOF. ``on_eof`` is called once, from this thread."""

    def __init__(self, fd: int, source: str, passthrough: "Console | BinaryIO | None", logfile: BinaryIO | None,
                 out_lock: threading.Lock, fanout: SinkFanout, on_eof: Callable[[str], None]) -> None:
        super().__init__(name=f"pump-{source}", daemon=True)
        self.fd = fd
        self.source = source
        self.passthrough = passthrough
        self.logfile = logfile
        self.out_lock = out_lock
        self.fanout = fanout
        self.on_eof = on_eof
        self.bytes = 0
        self.lines = 0
        self._failed = False

    def _handle(self, chunk: bytes, splitter: LineSplitter) -> None:
        self.bytes += len(chunk)
        with self.out_lock:
            if self.passthrough is not None:
                offer = getattr(self.passthrough, "offer", None)
                if offer is not None:
                    offer(chunk)  # a ConsoleWriter: never blocks
                else:
                    try:
                        self.passthrough.write(chunk)  # type: ignore[union-attr]
                        self.passthrough.flush()  # type: ignore[union-attr]
                    except (OSError, ValueError):
                        self.passthrough = None  # our stdout went away; keep the log file
            if self.logfile is not None:
                try:
                    self.logfile.write(chunk)
                except (OSError, ValueError) as e:
                    log.error("job_log_write_failed", error=str(e),
                              message="cannot append to the job log file; output still goes to stdout")
                    self.logfile = None
        lines = splitter.push(chunk)
        if lines:
            self.lines += len(lines)
            self.fanout.feed(self.source, lines)

    def _report(self, e: BaseException) -> None:
        if not self._failed:  # once per pump: a repeating failure must not flood the journal
            self._failed = True
            log.error("output_pump_failed", source=self.source, error=repr(e), exc_info=e,
                      message=f"handling the job's {self.source} failed ({e!r}); the pipe keeps being "
                              "drained so the job never blocks, and the failure is reported once")

    def run(self) -> None:
        splitter = LineSplitter()
        try:
            while True:
                try:
                    chunk = os.read(self.fd, CHUNK)
                except InterruptedError:
                    continue
                except OSError as e:
                    log.warning("pipe_read_failed", source=self.source, error=str(e))
                    break
                if not chunk:
                    break
                try:
                    self._handle(chunk, splitter)
                except Exception as e:  # noqa: BLE001 - the pipe must keep draining whatever fails
                    self._report(e)
            try:
                rest = splitter.flush()
                if rest:
                    self.lines += len(rest)
                    self.fanout.feed(self.source, rest)
            except Exception as e:  # noqa: BLE001
                self._report(e)
        finally:
            try:
                os.close(self.fd)
            except OSError:
                pass
            with self.out_lock:
                if self.logfile is not None:
                    try:
                        self.logfile.flush()
                    except Exception:  # noqa: BLE001 - reported already; on_eof must still run
                        pass
            self.on_eof(self.source)
