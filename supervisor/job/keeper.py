"""The output keeper: a small process that holds the read ends of the job's stdout and stderr.

Why a process of its own: when the daemon read the job's pipes itself, a ``kill -9`` of the
daemon (or the systemd watchdog's SIGABRT) left the pipes without a reader, and the job's next
print failed with EPIPE: the job died with its supervisor, and the lines the daemon had not yet
written to job.log were lost. The keeper (as conmon or containerd-shim do for containers) outlives
the daemon: it appends every chunk to job.log as soon as it is read (unbuffered: nothing waits in
a dead process's memory), then hands it to the daemon over a socket, framed with its stream, for
the console pass-through and the detectors. When the daemon is gone the keeper goes on with
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
byte and a length.
"""

from __future__ import annotations

import os
import select
import struct
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Callable

FRAME = struct.Struct("!BI")  # kind, payload length
STDOUT, STDERR, EOF_STDOUT, EOF_STDERR, NOTICE = 1, 2, 3, 4, 5
CHUNK = 1 << 18
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

    def write(self, chunk: bytes) -> None:
        if self.fd < 0:
            return
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
            return
        self._at_line_end = chunk.endswith((b"\n", b"\r"))
        if self.lost:
            self.notice(f"job_log_write_recovered: {self.path or 'the job log'} is written again; "
                        f"{self.lost} bytes of the job's output could not be written to it meanwhile")
            self.lost = 0

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


class Keeper:
    def __init__(self, out_fd: int, err_fd: int, sock_fd: int, log_fd: int, log_path: str,
                 err_log_fd: int = -1, err_log_path: str = "") -> None:
        self.streams = {out_fd: (STDOUT, EOF_STDOUT), err_fd: (STDERR, EOF_STDERR)}
        self.sock_fd = sock_fd
        self.log = JobLog(log_fd, log_path, self.notice)
        self.err_log = JobLog(err_log_fd, err_log_path, self.notice)  # the job's stderr alone

    def send(self, kind: int, payload: bytes) -> None:
        """To the daemon, blocking (a daemon that reads slowly slows the job, as a pipe would);
        once the daemon is gone (EPIPE, ECONNRESET) only job.log is written."""
        if self.sock_fd < 0:
            return
        head = FRAME.pack(kind, len(payload))
        try:
            sent = os.writev(self.sock_fd, [head, payload])
            rest = (head + payload)[sent:] if sent < len(head) + len(payload) else b""
            while rest:
                rest = rest[os.write(self.sock_fd, rest):]
        except OSError:
            os.close(self.sock_fd)
            self.sock_fd = -1

    def notice(self, text: str) -> None:
        self.send(NOTICE, text.encode("utf-8", "replace"))

    def run(self) -> None:
        poller = select.poll()
        for fd in self.streams:
            poller.register(fd, select.POLLIN)
        open_fds = set(self.streams)
        last = 0.0
        while open_fds:
            try:
                ready = poller.poll()
            except InterruptedError:
                continue
            now = time.monotonic()
            if now - last < COALESCE_S:
                time.sleep(COALESCE_S)
            last = now
            for fd, _ev in ready:
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
                    self.send(eof_kind, b"")
                    continue
                self.log.write(chunk)  # first: whatever happens to the daemon, job.log has it
                if data_kind == STDERR:
                    self.err_log.write(chunk)
                self.send(data_kind, chunk)


def main(argv: list[str]) -> int:
    out_fd, err_fd, sock_fd, log_fd = (int(a) for a in argv[:4])
    err_log_fd = int(argv[5]) if len(argv) > 5 else -1
    Keeper(out_fd, err_fd, sock_fd, log_fd, argv[4] if len(argv) > 4 else "",
           err_log_fd, argv[6] if len(argv) > 6 else "").run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
