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

Size-based rotation (``[job] log_max_bytes``, ``log_keep``) is the keeper's too, as the only
writer: past the size, between two lines, job.log is renamed to job.log.1 (job.log.1 to .2 ...,
the oldest beyond ``log_keep`` deleted) and a new job.log opened, so no byte is written anywhere
else and none is lost; job.stderr.log rotates the same way on its own. A rotation of job.log is
sent to the daemon as a ``job_log_rotated`` notice, in order with the output: the bytes before it
are in the renamed file, those after in the new one (:func:`rotated_logs` finds them again).

Run as ``python -I -S keeper.py OUT_FD ERR_FD SOCK_FD LOG_FD LOG_PATH [ERR_LOG_FD ERR_LOG_PATH
[MAX_BYTES KEEP]]`` (a log fd -1 and an empty path when there is no such log; MAX_BYTES 0: no
rotation): standard library only, so it starts in milliseconds and imports nothing of the daemon.
The frame format is :data:`FRAME`: a kind byte and a length; a data frame's payload starts with
:data:`DATA_HEAD` (where the chunk ends in job.log, when it was read), a gap frame's with
:data:`GAP_HEAD` (job.log's identity) followed by :data:`GAP_RANGE` entries.
"""

from __future__ import annotations

import os
import select
import struct
import sys
import time
from array import array
from collections import deque
from itertools import islice, takewhile
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Callable

FRAME = struct.Struct("!BI")  # kind, payload length
STDOUT, STDERR, EOF_STDOUT, EOF_STDERR, NOTICE, GAP = 1, 2, 3, 4, 5, 6
DATA_HEAD = struct.Struct("!Qd")  # end offset of the chunk in job.log (NOT_IN_LOG: not there), read at (monotonic)
GAP_HEAD = struct.Struct("!QQ")  # job.log's st_dev, st_ino: the daemon reads the ranges back from that file only
GAP_RANGE = struct.Struct("!BQQd")  # stream (STDOUT/STDERR), offset, length, first read at (monotonic)
NOT_IN_LOG = (1 << 64) - 1
ROTATED = "job_log_rotated"  # the notice of a job.log rotation: later data frames' offsets are in the new file
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
# A log past its size is rotated at the end of a line; when the job prints a line longer than
# this beyond the size (or a progress bar that never ends one), it is cut there instead.
ROTATE_CUT_AFTER = 1 << 20
ROTATE_RETRY_S = 60.0  # a rotation that failed (a read-only dir) is tried again this much later
MAX_KEEP = 100  # rotated logs at most ([job] log_keep's maximum): how far readers look


def rotated_path(log_path: str, n: int) -> str:
    """The ``n``-th rotated log: ``job.log.1`` is the newest."""
    return f"{log_path}.{n}"


def rotated_logs(log_path: str) -> list[str]:
    """The rotated logs there are, newest first (``job.log.1``, ``.2``, ... up to the first missing)."""
    return list(takewhile(os.path.lexists, (rotated_path(log_path, n) for n in range(1, MAX_KEEP + 1))))


def stderr_log_path(log_path: str) -> str:
    """The stderr-only sidecar of a job log: ``job.log`` -> ``job.stderr.log``, ``out`` -> ``out.stderr``."""
    head, dot, ext = log_path.rpartition(".")
    if dot and "/" not in ext and head and not head.endswith("/"):
        return f"{head}.stderr.{ext}"
    return f"{log_path}.stderr"


class JobLog:
    """job.log, appended unbuffered; rotated past ``max_bytes`` (0: never), keeping ``keep``;
    reopened by path when logrotate moved it away (create mode); copytruncate needs nothing
    (O_APPEND). Write errors (a full disk) are counted and said once per episode; the keeper and
    the job go on. ``rotated`` names the rotation notice (empty: rotations are not said)."""

    def __init__(self, fd: int, path: str, notice: Callable[[str], None], max_bytes: int = 0,
                 keep: int = 0, rotated: str = "") -> None:
        self.fd = fd
        self.path = path
        self.notice = notice
        self.max_bytes = max_bytes if keep > 0 else 0
        self.keep = min(keep, MAX_KEEP)
        self.rotated = rotated
        self.lost = 0
        self._checked = time.monotonic()
        self._retry_at = 0.0  # no rotation tried before this (one failed)
        self._at_line_end = True
        self.ident = self._ident()
        self.size = self._size()

    def cut(self, chunk: bytes) -> int:
        """Where to split ``chunk`` so that a rotation due now falls after its first line end (0: no split)."""
        if not self.max_bytes or self.size < self.max_bytes or self._at_line_end or time.monotonic() < self._retry_at:
            return 0
        i = chunk.find(b"\n")
        return i + 1 if 0 <= i < len(chunk) - 1 else 0

    def _size(self) -> int:
        try:
            return os.fstat(self.fd).st_size
        except OSError:
            return 0

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
        if self.max_bytes and self.size >= self.max_bytes and self.path and (
                self._at_line_end or self.size >= self.max_bytes + ROTATE_CUT_AFTER):
            self._rotate()  # the whole chunk goes to one file: its place in it stays one range
        view = memoryview(chunk)
        try:
            while view:
                n = os.write(self.fd, view)
                self.size += n
                view = view[n:]
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
                self.size = now.st_size  # copytruncate (or another writer) changed it: the size as it is
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
        self.size = self._size()

    def _rotate(self) -> None:
        """job.log -> job.log.1 (job.log.1 -> .2 ..., the oldest beyond ``keep`` deleted), then a
        new job.log. A rename that fails leaves everything where it was: the output goes on into
        the same file, said once, and the rotation is tried again after :data:`ROTATE_RETRY_S`."""
        now = time.monotonic()
        if now < self._retry_at:
            return
        try:
            st = os.stat(self.path, follow_symlinks=False)
            moved = (st.st_dev, st.st_ino) != self._ident()
        except OSError:
            moved = True
        if moved:  # by someone else (logrotate, an earlier attempt's keeper): follow, never rotate theirs
            self._checked = 0.0
            self._follow_rotation()
            return
        try:
            for n in range(self.keep + 1, MAX_KEEP + 1):  # left by a larger log_keep
                if not os.path.lexists(rotated_path(self.path, n)):
                    break
                os.unlink(rotated_path(self.path, n))
            for n in range(self.keep - 1, 0, -1):
                if os.path.lexists(rotated_path(self.path, n)):
                    os.replace(rotated_path(self.path, n), rotated_path(self.path, n + 1))
            os.replace(self.path, rotated_path(self.path, 1))
        except OSError as e:
            self._retry_at = now + ROTATE_RETRY_S
            self.notice(f"job_log_rotate_failed: cannot rotate {self.path} at {self.size} bytes ({e}); the job's "
                        f"output goes on into it past [job] log_max_bytes; tried again in {ROTATE_RETRY_S:.0f} s")
            return
        try:  # never through a symlink, 0600: the same rules as the first open
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as e:
            self._retry_at = now + ROTATE_RETRY_S
            self.notice(f"job_log_rotate_failed: {self.path} was renamed to {rotated_path(self.path, 1)} but a new "
                        f"one cannot be created ({e}); the output goes on into the renamed file")
            return
        os.close(self.fd)
        self.fd, size, self.size, self._checked = fd, self.size, 0, now
        self.ident = self._ident()
        if self.rotated:
            self.notice(f"{self.rotated}: {self.path} reached {size} bytes ([job] log_max_bytes {self.max_bytes}): "
                        f"renamed to {rotated_path(self.path, 1)} (at most {self.keep} rotated kept, the oldest "
                        f"deleted); the output goes on into a new {self.path}")


class Keeper:
    def __init__(self, out_fd: int, err_fd: int, sock_fd: int, log_fd: int, log_path: str,
                 err_log_fd: int = -1, err_log_path: str = "", max_bytes: int = 0, keep: int = 0) -> None:
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
        self.log = JobLog(log_fd, log_path, self.notice, max_bytes, keep, rotated=ROTATED)
        self.err_log = JobLog(err_log_fd, err_log_path, self.notice, max_bytes, keep)  # the job's stderr alone

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
        # A log due for rotation in the middle of a line (the job writes a line's text and its
        # newline apart, PYTHONUNBUFFERED): the chunk is split after its first line end, so the
        # rotation falls between two lines and each piece lies whole in one file.
        cut = self.log.cut(chunk) or (self.err_log.cut(chunk) if kind == STDERR else 0)
        if cut:
            self._data(kind, chunk[:cut], now)
            chunk = chunk[cut:]
        self._data(kind, chunk, now)

    def _data(self, kind: int, chunk: bytes, now: float) -> None:
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
    max_bytes, keep = (int(argv[7]), int(argv[8])) if len(argv) > 8 else (0, 0)
    Keeper(out_fd, err_fd, sock_fd, log_fd, argv[4] if len(argv) > 4 else "",
           err_log_fd, argv[6] if len(argv) > 6 else "", max_bytes, keep).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
