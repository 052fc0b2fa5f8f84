"""The job's stdout/stderr in the daemon: pass-through, and lines for the monitors.

The output keeper (:mod:`.keeper`, a process of its own) reads the job's pipes, appends every
byte to job.log and sends the chunks here, framed with their stream; :class:`KeeperLink` reads
them on one thread. Each stream's bytes go unchanged to its own console (:class:`~.console.Consoles`:
the job's stdout to the daemon's stdout, its stderr to the daemon's stderr, as supervisord, systemd
and Slurm's ``--error`` keep them), each through a :class:`~.console.ConsoleWriter`, which never
blocks; only complete lines (decoded as UTF-8 with replacement, capped in length: :mod:`.linesplit`)
go to the sinks.
"""

from __future__ import annotations

import os
import threading
from typing import Callable, Protocol, Sequence, runtime_checkable

import structlog

from ..events import LineSink
from .catchup import LagGauge, LogAhead, LogReadback
from .console import Consoles
from .keeper import DATA_HEAD, EOF_STDERR, EOF_STDOUT, FRAME, GAP, NOTICE, ROTATED, STDERR, STDOUT
from .linesplit import LineSplitter

log = structlog.get_logger("supervisor.job.output")

# Behind the job by this much, the output is also looked at ahead of the parsers for non-finite
# values (:class:`~.catchup.LogAhead`); below it, every line is judged in order and only in order.
AHEAD_AFTER_S = 1.0


@runtime_checkable
class AheadSink(Protocol):
    """A sink that judges a line found ahead of the in-order reading (a non-finite value), given
    with the lines before it; the same lines still come through ``feed`` later, in order."""

    def feed_ahead(self, source: str, lines: Sequence[str]) -> None: ...


class SinkFanout:
    """Offers line batches to every registered sink; a failing sink is reported once and dropped."""

    def __init__(self) -> None:
        self._sinks: list[LineSink] = []
        self._ahead: list[AheadSink] = []
        self._lock = threading.Lock()

    def add(self, sink: LineSink) -> None:
        with self._lock:
            self._sinks = [*self._sinks, sink]
            if isinstance(sink, AheadSink):
                self._ahead = [*self._ahead, sink]

    def remove(self, sink: LineSink) -> None:
        with self._lock:
            self._sinks = [s for s in self._sinks if s is not sink]
            self._ahead = [s for s in self._ahead if s is not sink]

    @property
    def judges_ahead(self) -> bool:
        return bool(self._ahead)

    def feed_ahead(self, source: str, lines: Sequence[str]) -> None:
        for sink in self._ahead:  # copy-on-write list, as feed
            sink.feed_ahead(source, lines)  # the caller reports a failure (the in-order path is unhurt)

    def feed(self, source: str, lines: Sequence[str]) -> None:
        for sink in self._sinks:  # copy-on-write list: safe without the lock
            try:
                sink.feed(source, lines)
            except Exception as e:  # a monitor must never take the pump down
                log.error("monitor_failed", monitor=type(sink).__name__, error=repr(e),
                          message=f"line monitor {type(sink).__name__} raised {e!r}; it is disabled, "
                                  "the job keeps running and its output is still passed through")
                self.remove(sink)


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
        self._ahead = LogAhead(log_path, max(0, self.gauge.end)) if log_path else None
        # Set by :meth:`cut` (from the loop's thread; a bool is read atomically): the frames still
        # to come are dropped unhandled, so this thread ends with the keeper, not after the backlog.
        self._cut = False

    def cut(self) -> None:
        """Stop handling the job's output: a stop's catch-up ran out of its bound (the daemon must
        exit within a scheduler's kill wait). What is not handled yet is in job.log already; it is
        neither passed to the console nor parsed. Each stream's end is still reported."""
        self._cut = True

    @property
    def ended(self) -> bool:
        """Both streams reached EOF (every writer gone), or the keeper did."""
        return not self._open or not self.is_alive()

    def _data(self, kind: int, chunk: bytes) -> None:
        self.bytes += len(chunk)
        if self._cut:
            return
        if self.passthrough is not None:
            console = self.passthrough.err if kind == STDERR else self.passthrough.out
            if console is not None:
                console.offer(chunk)  # a ConsoleWriter: never blocks
        lines = self._splitters[kind].push(chunk)
        if lines:
            self.lines += len(lines)
            self.fanout.feed(self._open.get(kind, "stdout"), lines)
        if self._ahead is not None and self.gauge.behind() >= AHEAD_AFTER_S and self.fanout.judges_ahead:
            self._look_ahead(self._ahead)

    def _look_ahead(self, ahead: LogAhead) -> None:
        """Seconds behind (a burst read back from job.log): a NaN the job printed since must not
        wait for every line before it to be parsed; the output not handled yet is looked at for
        non-finite values and those lines judged now (:class:`~.catchup.LogAhead`)."""
        try:
            ahead.skip_to(self.gauge.end)
            for source, lines in ahead.look():
                self.fanout.feed_ahead(source, lines)
        except Exception as e:  # the in-order reading goes on whatever fails here
            self._report(e)

    def _eof(self, kind: int) -> None:
        source = self._open.pop(kind, None)
        if source is None:
            return
        try:
            rest = self._splitters[kind].flush()
            if rest and not self._cut:
                self.lines += len(rest)
                self.fanout.feed(source, rest)
        except Exception as e:  # on_eof must still run
            self._report(e)
        self.on_eof(source)

    def _frame(self, kind: int, payload: bytes) -> None:
        if kind in (STDOUT, STDERR):
            self._data(kind, payload)
        elif kind == GAP:
            if self._cut:
                return  # not read back: the bytes are in job.log, the catch-up was cut
            for stream, chunk in self._readback.ranges(payload):
                self._data(stream, chunk)
        elif kind == EOF_STDOUT:
            self._eof(STDOUT)
        elif kind == EOF_STDERR:
            self._eof(STDERR)
        elif kind == NOTICE:
            self._notice(payload.decode("utf-8", "replace"))

    def _notice(self, text: str) -> None:
        """What the keeper says ("event: message"): job.log's rotation, its write failures."""
        event, _, message = text.partition(": ")
        if event == ROTATED:
            self.gauge.rotated()  # the data frames after this one end at offsets in the new job.log
            log.info("job_log_rotated", keeper_pid=self.keeper_pid, message=message)
        elif event == "job_log_rotate_failed":
            log.error("job_log_rotate_failed", keeper_pid=self.keeper_pid, message=message)
        else:
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
        except Exception as e:  # the link must keep draining whatever fails
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
            if self._ahead is not None:
                self._ahead.close()
            self.gauge.idle()
            if self.gauge.read_back and not self._cut:  # a cut catch-up was said by the stop
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
