"""The output keeper: a small process that holds the read ends of the job's stdout and stderr.

Why a process of its own: when the daemon read the job's pipes itself, a ``kill -9`` of the
daemon (or the systemd watchdog's SIGABRT) left the pipes without a reader, and the job's next
print failed with EPIPE: the job died with its supervisor, and the lines the daemon had not yet
written to job.log were lost. The keeper (as conmon or containerd-shim do for containers) outlives
the daemon: it appends every chunk to job.log as soon as it is read (unbuffered: nothing waits in
a dead process's memory), then hands it to the daemon over a socket, framed with its stream, for
the console pass-through and the detectors. The daemon never slows the job: the socket is written
without blocking, from a bounded queue (:data:`BACKLOG`); when the daemon falls further behind than
that (a burst of output its parsers cannot take at the job's speed), the keeper stops copying the
bytes and sends their place in job.log instead (a :data:`GAP` frame: stream, offset, length, when
read), and the daemon reads them back from job.log at its own pace, in order. Only output that is
not in job.log (no log, a failed write, a gap too fragmented to describe: :data:`MAX_GAP_RANGES`)
is still handed over blocking, as a pipe would: it exists nowhere else. When the daemon is gone the keeper goes on with
job.log alone, so the job keeps running and printing until the next daemon stops it (the next
daemon closes the previous life as before). It exits when both pipes reach EOF (every writer,
the job and whatever it started, is gone). The keeper's own death (a ``kill -9`` from outside)
does not kill the job either: the daemon keeps duplicates of the read ends, so the pipes never
lose their last reader, and starts a new keeper on them (process.JobProcess.respawn_keeper).

The job still writes into pipes, not files: a file on a full disk would fail the job's own print
with ENOSPC and kill it; a pipe never does. job.log write errors are the keeper's to report.

The job's stderr also goes, alone, to a sidecar beside job.log (:func:`stderr_log_path`:
``job.stderr.log``), so ``transformer-supervisor logs --stderr`` can show it without the
stdout lines around it: job.log stays the byte-exact interleaving of both streams as read.

Run as ``python -I -S keeper.py OUT_FD ERR_FD SOCK_FD LOG_FD LOG_PATH [ERR_LOG_FD ERR_LOG_PATH]``
(a log fd -1 and an empty path when there is no such log): standard library only, so it starts
in milliseconds and imports nothing of the daemon. The frame format is :data:`FRAME`: a kind
byte and a length; a data frame's payload starts with :data:`DATA_HEAD` (where the chunk ends in
job.log, when it was read), a gap frame's with :data:`GAP_HEAD` (job.log's identity) followed by
:data:`GAP_RANGE` entries.
"""

from __future__ import annotations

import os
import select
import struct
import sys
import time
from array import array
from collections import deque
from itertools import islice
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Callable

FRAME = struct.Struct("!BI")  # kind, payload length
STDOUT, STDERR, EOF_STDOUT, EOF_STDERR, NOTICE, GAP = 1, 2, 3, 4, 5, 6
DATA_HEAD = struct.Struct("!Qd")  # end offset of the chunk in job.log (NOT_IN_LOG: not there), read at (monotonic)
GAP_HEAD = struct.Struct("!QQ")  # job.log's st_dev, st_ino: the daemon reads the ranges back from that file only
GAP_RANGE = struct.Struct("!BQQd")  # stream (STDOUT/STDERR), offset, length, first read at (monotonic)
NOT_IN_LOG = (1 << 64) - 1
CHUNK = 1 << 18
# Frames waiting for the daemon, in bytes: past this the bytes stay in job.log and only their
# place is sent (a burst costs the daemon time, never the job, and the keeper bounded memory).
BACKLOG = 4 << 20
# A gap is a list of ranges (merged while one stream runs on); past this many (both streams
# interleaving in tiny chunks for a long time) the keeper waits for the daemon instead.
MAX_GAP_RANGES = 65536
GAP_FRAME_RANGES = 2048  # ranges per gap frame (a frame stays under 64 KiB)
# While output streams in, wait this long between reads so that a read takes many lines, not
# one: each chunk costs four system calls here and a turn of the daemon's parsers, whatever its
# size. Only when data came less than this ago (a trickle of lines is forwarded at once), and
# far below what a pipe of 1 MiB holds at any rate a job prints.
COALESCE_S = 0.001
ROTATION_CHECK_S = 1.0  # how often the keeper looks whether job.log was renamed away (logrotate)


def stderr_log_path(log_path: str) -> str:
    """The stderr-only sidecar of a job log: ``job.log`` -> ``job.stderr.log``, ``out`` -> ``out.stderr``."""
    head, dot, ext = log_path.rpartition(".")
    if dot and "/" not in ext and head and not head.endswith("/"):
        return f"{head}.stderr.{ext}"
    return f"{log_path}.stderr"


class JobLog:
    """job.log, appended unbuffered; reopened by path when logrotate moved it away (create mode);
    copytruncate needs nothing (O_APPEND). Write errors (a full disk) are counted and said once
    per episode; the keeper and the job go on."""

    def __init__(self, fd: int, path: str, notice: Callable[[str], None]) -> None:
        self.fd = fd
        self.path = path
        self.notice = notice
        self.lost = 0
        self._checked = time.monotonic()
        self._at_line_end = True
        self.ident = self._ident()

    def _ident(self) -> tuple[int, int]:
        try:
            st = os.fstat(self.fd)
        except OSError:
            return (0, 0)
        return (st.st_dev, st.st_ino)

    def end(self) -> int:
        """Where the last write ended (O_APPEND: the file's end as this write left it)."""
        try:
            return os.lseek(self.fd, 0, os.SEEK_CUR)
        except OSError:
            return NOT_IN_LOG

    def write(self, chunk: bytes) -> bool:
        """Appends the chunk; True when all of it is in the file."""
        if self.fd < 0:
            return False
        if self.path and time.monotonic() - self._checked >= ROTATION_CHECK_S and (
                self._at_line_end or time.monotonic() - self._checked >= 10 * ROTATION_CHECK_S):
            self._follow_rotation()  # between lines: no line is cut in two across the files
        view = memoryview(chunk)
        try:
            while view:
                view = view[os.write(self.fd, view):]
        except OSError as e:
            if not self.lost:
                self.notice(f"job_log_write_failed: cannot append to {self.path or 'the job log'} ({e}); "
                            "the job keeps running and its output still reaches the daemon; retrying with "
                            "the next output")
            self.lost += len(view)
            return False
        self._at_line_end = chunk.endswith((b"\n", b"\r"))
        if self.lost:
            self.notice(f"job_log_write_recovered: {self.path or 'the job log'} is written again; "
                        f"{self.lost} bytes of the job's output could not be written to it meanwhile")
            self.lost = 0
        return True

    def _follow_rotation(self) -> None:
        self._checked = time.monotonic()
        try:
            st = os.stat(self.path, follow_symlinks=False)
            now = os.fstat(self.fd)
            if (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino):
                return
        except FileNotFoundError:
            pass  # renamed away and not (yet) re-created: create it
        except OSError:
            return
        try:  # never through a symlink, 0600: the same rules as the first open
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as e:
            self.notice(f"job_log_reopen_failed: {self.path} was moved away but cannot be reopened ({e}); "
                        "the job's output goes on into the moved file")
            self.path = ""  # said once; keep the file we have
            return
        os.close(self.fd)
        self.fd = fd
        self.ident = self._ident()


class Keeper:
    def __init__(self, out_fd: int, err_fd: int, sock_fd: int, log_fd: int, log_path: str,
                 err_log_fd: int = -1, err_log_path: str = "") -> None:
        self.streams = {out_fd: (STDOUT, EOF_STDOUT), err_fd: (STDERR, EOF_STDERR)}
        self.sock_fd = sock_fd
        if sock_fd >= 0:
            os.set_blocking(sock_fd, False)
        self.queue: deque[bytes] = deque()  # frames for the daemon, in order
        self.queued = 0  # their bytes
        self.sent = 0  # bytes of queue[0] already sent
        # The open gap: GAP_RANGE fields flattened (stream, offset, length, read at in microseconds),
        # for output that is in job.log (file identity gap_ident) and not sent.
        self.gap = array("Q")
        self.gap_ident = (0, 0)
        self.log = JobLog(log_fd, log_path, self.notice)
        self.err_log = JobLog(err_log_fd, err_log_path, self.notice)  # the job's stderr alone

    # -- to the daemon --------------------------------------------------------------------
    def _frame(self, kind: int, payload: bytes) -> None:
        if self.gap and kind != GAP:
            self._close_gap()  # the gap's bytes were read before this frame's: they go first
        if self.sock_fd >= 0:
            self.queue.append(FRAME.pack(kind, len(payload)) + payload)
            self.queued += FRAME.size + len(payload)

    def flush(self) -> None:
        """Send what the socket takes now, without waiting; a gap goes once the frames before it
        are out (the daemon sees every byte in the order read). Once the daemon is gone (EPIPE,
        ECONNRESET) only job.log is written."""
        while self.sock_fd >= 0:
            if not self.queue:
                if not self.gap:
                    return
                self._close_gap()
            head = memoryview(self.queue[0])[self.sent:]
            try:
                n = os.writev(self.sock_fd, [head, *islice(self.queue, 1, 64)])
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._daemon_gone()
                return
            self.queued -= n
            while n:
                left = len(self.queue[0]) - self.sent
                if n < left:
                    self.sent += n
                    break
                n -= left
                self.queue.popleft()
                self.sent = 0

    def flush_blocking(self) -> None:
        """Everything out, waiting for the daemon (output that exists nowhere else; the end)."""
        waiter = select.poll()
        while self.sock_fd >= 0 and (self.queue or self.gap):
            self.flush()
            if self.sock_fd >= 0 and (self.queue or self.gap):
                waiter.register(self.sock_fd, select.POLLOUT)
                try:
                    waiter.poll(1000)
                except InterruptedError:
                    pass
                waiter.unregister(self.sock_fd)

    def _daemon_gone(self) -> None:
        os.close(self.sock_fd)
        self.sock_fd = -1
        self.queue.clear()
        self.queued = self.sent = 0
        del self.gap[:]

    def _close_gap(self) -> None:
        """The open gap as frames at the end of the queue (a new gap may open behind them)."""
        head = GAP_HEAD.pack(*self.gap_ident)
        fields, self.gap = self.gap, array("Q")
        for i in range(0, len(fields), 4 * GAP_FRAME_RANGES):
            part = fields[i:i + 4 * GAP_FRAME_RANGES]
            body = b"".join(GAP_RANGE.pack(part[j], part[j + 1], part[j + 2], part[j + 3] / 1e6)
                            for j in range(0, len(part), 4))
            self._frame(GAP, head + body)

    def _in_gap(self, kind: int, start: int, length: int, now: float) -> bool:
        """Record the chunk's place in job.log instead of its bytes; False when it cannot be."""
        ident = self.log.ident
        if self.gap and ident != self.gap_ident:
            self._close_gap()  # job.log was rotated: the rest is read from the new file
        if not self.gap:
            self.gap_ident = ident
        gap = self.gap
        if gap and gap[-4] == kind and gap[-3] + gap[-2] == start:
            gap[-2] += length  # the same stream runs on in the file: one range
            return True
        if len(gap) >= 4 * MAX_GAP_RANGES:
            return False
        gap.extend((kind, start, length, int(now * 1e6)))
        return True

    def data(self, kind: int, chunk: bytes, now: float) -> None:
        in_log = self.log.write(chunk)  # first: whatever happens to the daemon, job.log has it
        if kind == STDERR:
            self.err_log.write(chunk)
        if self.sock_fd < 0:
            return
        end = self.log.end() if in_log else NOT_IN_LOG
        if self.gap or self.queued + len(chunk) > BACKLOG:
            # The daemon is behind: leave the bytes in job.log, send where they are.
            if end != NOT_IN_LOG and self._in_gap(kind, end - len(chunk), len(chunk), now):
                self.flush()
                return
            self.flush_blocking()  # not in job.log (or a gap too ragged): the daemon must have them
        self._frame(kind, DATA_HEAD.pack(end, now) + chunk)
        self.flush()

    def notice(self, text: str) -> None:
        self._frame(NOTICE, text.encode("utf-8", "replace"))
        self.flush()

    # -- from the job ---------------------------------------------------------------------
    def run(self) -> None:
        poller = select.poll()
        for fd in self.streams:
            poller.register(fd, select.POLLIN)
        open_fds = set(self.streams)
        last = 0.0
        watching = -1  # the socket fd registered for POLLOUT while frames or a gap wait
        while open_fds:
            want = self.sock_fd if self.sock_fd >= 0 and (self.queue or self.gap) else -1
            if want != watching:
                if watching >= 0:
                    try:
                        poller.unregister(watching)
                    except KeyError:
                        pass
                if want >= 0:
                    poller.register(want, select.POLLOUT)
                watching = want
            try:
                ready = poller.poll()
            except InterruptedError:
                continue
            now = time.monotonic()
            if now - last < COALESCE_S:
                time.sleep(COALESCE_S)
            last = now
            for fd, _ev in ready:
                if fd == watching:
                    self.flush()
                    continue
                if fd not in open_fds:
                    continue
                try:
                    chunk = os.read(fd, CHUNK)
                except InterruptedError:
                    continue
                except OSError:
                    chunk = b""
                data_kind, eof_kind = self.streams[fd]
                if not chunk:
                    poller.unregister(fd)
                    os.close(fd)
                    open_fds.discard(fd)
                    self._frame(eof_kind, b"")
                    self.flush()
                    continue
                self.data(data_kind, chunk, time.monotonic())
        self.flush_blocking()  # the job's output ended: the daemon gets the rest, then EOF


def main(argv: list[str]) -> int:
    out_fd, err_fd, sock_fd, log_fd = (int(a) for a in argv[:4])
    err_log_fd = int(argv[5]) if len(argv) > 5 else -1
    Keeper(out_fd, err_fd, sock_fd, log_fd, argv[4] if len(argv) > 4 else "",
           err_log_fd, argv[6] if len(argv) > 6 else "").run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
