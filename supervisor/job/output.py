"""The job's stdout/stderr in the daemon: pass-through, and lines for the monitors.

The output keeper (:mod:`.keeper`, a process of its own) reads the job's pipes, appends every
byte to job.log and sends the chunks here, framed with their stream; :class:`KeeperLink` reads
them on one thread. Each stream's bytes go unchanged to its own console (:class:`Consoles`: the
job's stdout to the daemon's stdout, its stderr to the daemon's stderr, as supervisord, systemd
and Slurm's ``--error`` keep them), each through a :class:`ConsoleWriter`, which never blocks;
only complete lines (decoded as UTF-8 with replacement, capped in length) go to the sinks.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from dataclasses import dataclass
from typing import BinaryIO, Callable, Protocol, Sequence

import structlog

from ..events import LineSink
from .catchup import LagGauge, LogReadback
from .consoleline import SharedLine
from .keeper import DATA_HEAD, EOF_STDERR, EOF_STDOUT, FRAME, GAP, NOTICE, STDERR, STDOUT

log = structlog.get_logger("supervisor.job.output")

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


class KeeperLink(threading.Thread):
    """The daemon's end of the output keeper (:mod:`.keeper`): framed chunks of the job's stdout
    and stderr, each stream split into lines of its own (a tqdm bar on stderr never runs into a
    metric line on stdout), passed through to its own console and offered to the sinks. job.log is
    the keeper's (written before the chunk is sent here). ``on_eof(source)`` is called once per
    stream, from this thread; a keeper that dies before both streams ended is reported.

    The keeper does not wait for this thread: what it could not queue for it (a burst faster than
    the parsers) arrives as gap frames, read back here from job.log (``log_path``) in order, so
    the console and the sinks get every byte, later. :attr:`gauge` says how far behind that is."""

    def __init__(self, sock_fd: int, passthrough: Consoles | None, fanout: SinkFanout,
                 on_eof: Callable[[str], None], keeper_pid: int | None = None,
                 respawn: Callable[[], tuple[int, int] | None] | None = None, log_path: str = "") -> None:
        super().__init__(name="job-output", daemon=True)
        self.fd = sock_fd
        self.respawn = respawn  # a new keeper (its socket fd, pid) when this one dies before the job's output
        self.passthrough = passthrough
        self.fanout = fanout
        self.on_eof = on_eof
        self.keeper_pid = keeper_pid
        self.bytes = 0
        self.lines = 0
        self._splitters = {STDOUT: LineSplitter(), STDERR: LineSplitter()}
        self._open = {STDOUT: "stdout", STDERR: "stderr"}
        self._failed = False
        self.gauge = LagGauge(log_path)
        self._readback = LogReadback(log_path, self.gauge)

    @property
    def ended(self) -> bool:
        """Both streams reached EOF (every writer gone), or the keeper did."""
        return not self._open or not self.is_alive()

    def _data(self, kind: int, chunk: bytes) -> None:
        self.bytes += len(chunk)
        if self.passthrough is not None:
            console = self.passthrough.err if kind == STDERR else self.passthrough.out
            if console is not None:
                console.offer(chunk)  # a ConsoleWriter: never blocks
        lines = self._splitters[kind].push(chunk)
        if lines:
            self.lines += len(lines)
            self.fanout.feed(self._open.get(kind, "stdout"), lines)

    def _eof(self, kind: int) -> None:
        source = self._open.pop(kind, None)
        if source is None:
            return
        try:
            rest = self._splitters[kind].flush()
            if rest:
                self.lines += len(rest)
                self.fanout.feed(source, rest)
        except Exception as e:  # noqa: BLE001 - on_eof must still run
            self._report(e)
        self.on_eof(source)

    def _frame(self, kind: int, payload: bytes) -> None:
        if kind in (STDOUT, STDERR):
            self._data(kind, payload)
        elif kind == GAP:
            for stream, chunk in self._readback.ranges(payload):
                self._data(stream, chunk)
        elif kind == EOF_STDOUT:
            self._eof(STDOUT)
        elif kind == EOF_STDERR:
            self._eof(STDERR)
        elif kind == NOTICE:
            event, _, message = payload.decode("utf-8", "replace").partition(": ")
            level = log.error if event.endswith("_failed") else log.warning
            level(event, keeper_pid=self.keeper_pid, message=message)

    def _run(self, kind: int, parts: list[bytes], end: int) -> None:
        """Consecutive data frames of one stream, as one chunk; ``end``: the last one's end in job.log."""
        if parts:
            self._safe_frame(kind, b"".join(parts))
            self.gauge.handled(end)

    def _safe_frame(self, kind: int, payload: bytes) -> None:
        try:
            self._frame(kind, payload)
        except Exception as e:  # noqa: BLE001 - the link must keep draining whatever fails
            self._report(e)

    def _report(self, e: BaseException) -> None:
        if not self._failed:  # once: a repeating failure must not flood the journal
            self._failed = True
            log.error("output_pump_failed", error=repr(e), exc_info=e,
                      message=f"handling the job's output failed ({e!r}); it keeps being read so the job "
                              "never blocks, job.log keeps every byte, and the failure is reported once")

    def _keeper_replaced(self) -> bool:
        """The keeper's socket ended while a stream is still open: the keeper died (a kill -9 from
        outside). The job must not die with it: a new keeper on the daemon's read ends goes on."""
        if not self._open or self.respawn is None:
            return False
        got = self.respawn()
        if got is None:
            return False
        old = self.keeper_pid
        try:
            os.close(self.fd)
        except OSError:
            pass
        self.fd, self.keeper_pid = got
        log.warning("output_keeper_restarted", keeper_pid=self.keeper_pid, previous_pid=old,
                    message=f"the job's output keeper (pid {old}) died before the job's output ended; a new "
                            f"one (pid {self.keeper_pid}) reads the job's pipes, which stayed open: the job runs on "
                            "and its output still goes to job.log (what the dead keeper had read but not written "
                            "is lost; what it had written to job.log but not yet passed on here, up to its 4 MiB "
                            "queue and a burst's read-back, is in job.log but not parsed)")
        return True

    def run(self) -> None:
        buf = bytearray()
        try:
            while True:
                try:
                    data = os.read(self.fd, 1 << 18)
                except InterruptedError:
                    continue
                except OSError as e:
                    log.warning("output_link_read_failed", error=str(e))
                    data = b""
                if not data:
                    if self._keeper_replaced():
                        buf.clear()  # a frame cut short by the death: the new keeper starts afresh
                        continue
                    break
                buf += data
                pos, end = 0, len(buf)
                # Consecutive frames of one stream are handled as one chunk: the keeper sends what
                # each read gave it (a line or two while it keeps up with the job), and the
                # console, the splitter and the sinks cost per call, not per byte.
                run_kind, run_parts, run_end = 0, [], -1
                while end - pos >= FRAME.size:
                    kind, n = FRAME.unpack_from(buf, pos)
                    if end - pos - FRAME.size < n:
                        break
                    body = pos + FRAME.size
                    pos = body + n
                    if kind in (STDOUT, STDERR):
                        chunk_end, read_at = DATA_HEAD.unpack_from(buf, body)
                        payload = bytes(buf[body + DATA_HEAD.size:pos])
                        if kind == run_kind:
                            run_parts.append(payload)
                            run_end = chunk_end
                            continue
                        self._run(run_kind, run_parts, run_end)
                        self.gauge.handling(read_at)
                        run_kind, run_parts, run_end = kind, [payload], chunk_end
                    else:
                        self._run(run_kind, run_parts, run_end)
                        run_kind, run_parts = 0, []
                        self._safe_frame(kind, bytes(buf[body:pos]))
                self._run(run_kind, run_parts, run_end)
                del buf[:pos]
                if not buf:
                    self.gauge.idle()
        finally:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self._readback.close()
            self.gauge.idle()
            if self.gauge.read_back:
                log.info("output_caught_up", keeper_pid=self.keeper_pid, read_back_bytes=self.gauge.read_back,
                         max_lag_s=round(self.gauge.max_seconds, 3),
                         message=f"the job printed faster than the daemon handles output: {self.gauge.read_back} "
                                 f"bytes were read back from job.log, at most {self.gauge.max_seconds:.1f} s behind "
                                 "the job; the job never waited for it")
            if self._open:
                log.error("output_keeper_lost", keeper_pid=self.keeper_pid, streams=sorted(self._open.values()),
                          message="the job's output keeper ended before the job's output did and no new one "
                                  "could take over; what the job prints now is neither shown, parsed nor written "
                                  "to job.log")
            for kind in list(self._open):
                self._eof(kind)
