"""Pumping the job's stdout/stderr: pass-through, log file copy, and lines for the monitors.

One thread per pipe reads large chunks as soon as they arrive, so the job never blocks on a full
pipe buffer while we parse. Bytes go to the daemon's stdout unchanged and to the job log file;
only complete lines (decoded as UTF-8 with replacement, capped in length) go to the sinks.
"""

from __future__ import annotations

import os
import threading
from typing import BinaryIO, Callable, Sequence

import structlog

from .events import LineSink

log = structlog.get_logger("supervisor.output")

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


class LineSplitter:
    """Bytes -> complete decoded lines, keeping the partial tail; caps line length."""

    def __init__(self) -> None:
        self._tail = b""
        self._dropping = False  # inside an over-long line: skip until its newline

    def push(self, chunk: bytes) -> list[str]:
        data = self._tail + chunk
        cut = data.rfind(b"\n")
        if cut < 0:
            if len(data) > MAX_LINE:
                if not self._dropping:
                    self._dropping = True
                    self._tail = b""
                    return [data[:MAX_LINE].decode("utf-8", "replace") + " [...line truncated]"]
                self._tail = b""
                return []
            self._tail = data
            return []
        complete, self._tail = data[:cut], data[cut + 1:]
        lines = complete.decode("utf-8", "replace").split("\n")
        if self._dropping:
            lines = lines[1:]  # the rest of the over-long line
            self._dropping = False
        if any(len(x) > MAX_LINE for x in lines):
            lines = [x if len(x) <= MAX_LINE else x[:MAX_LINE] + " [...line truncated]" for x in lines]
        return lines

    def flush(self) -> list[str]:
        tail, self._tail = self._tail, b""
        if tail and not self._dropping:
            return [tail[:MAX_LINE].decode("utf-8", "replace")]
        self._dropping = False
        return []


class PipePump(threading.Thread):
    """Reads one pipe until EOF. ``on_eof`` is called once, from this thread."""

    def __init__(self, fd: int, source: str, passthrough: BinaryIO | None, logfile: BinaryIO | None,
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
                self.bytes += len(chunk)
                with self.out_lock:
                    if self.passthrough is not None:
                        try:
                            self.passthrough.write(chunk)
                            self.passthrough.flush()
                        except (OSError, ValueError):
                            self.passthrough = None  # our stdout went away; keep the log file
                    if self.logfile is not None:
                        try:
                            self.logfile.write(chunk)
                        except OSError as e:
                            log.error("job_log_write_failed", error=str(e),
                                      message="cannot append to the job log file; output still goes to stdout")
                            self.logfile = None
                lines = splitter.push(chunk)
                if lines:
                    self.lines += len(lines)
                    self.fanout.feed(self.source, lines)
            rest = splitter.flush()
            if rest:
                self.lines += len(rest)
                self.fanout.feed(self.source, rest)
        finally:
            try:
                os.close(self.fd)
            except OSError:
                pass
            with self.out_lock:
                if self.logfile is not None:
                    try:
                        self.logfile.flush()
                    except OSError:
                        pass
            self.on_eof(self.source)
