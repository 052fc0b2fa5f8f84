"""A child's pipes read to bounded tails under one deadline: the one way the daemon talks to a
short-lived child (a hook command, a load test, the environment probe, py-spy).

Why not ``Popen.communicate``: it keeps every byte the child writes, so a hook that writes 1 GB
to stderr made the daemon 2 GB to keep a 300-character tail of it. Here each pipe keeps its last
``keep`` bytes (what a message quotes: the last error line, the result line printed last) and
counts the rest. The deadline is one for the whole exchange (stdin written, pipes drained, the
child reaped), not per read, so a child that trickles a byte a second still ends on time.

A child that exits while something it started still holds its pipes open (``cmd &``) does not
hold the reader: once the child has exited the pipes get :data:`GRACE_S` more, then are left.
The caller kills the child's process group on a timeout (:func:`kill_group`): a child is always
started in a session of its own, so its group holds whatever it started.
"""
from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import IO, Any

#: The bytes kept of each stream by default: several error lines, or a result line.
KEEP_BYTES = 64 * 1024
#: How long the pipes are read after the child itself exited (its background children may hold them).
GRACE_S = 0.2
_CHUNK = 65536


@dataclass(frozen=True)
class Drained:
    """What came back from a child: each stream's tail, the bytes not kept, and how it ended."""

    stdout: bytes
    stderr: bytes
    dropped: int  # bytes read and not kept (both streams)
    returncode: int | None  # None: still running at the deadline (the caller kills it)
    timed_out: bool

    def stderr_tail(self, chars: int = 300) -> str:
        """The end of stderr as one readable string (what an error message quotes)."""
        return self.stderr.decode(errors="replace").strip()[-chars:]


class _Tail:
    """The last ``keep`` bytes written to it; the rest counted. Trimmed at twice the bound, so a
    stream of small chunks costs amortised O(1) a byte, never more than 2 x keep of memory."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.buf = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        self.buf += chunk
        if len(self.buf) > 2 * self.keep:
            cut = len(self.buf) - self.keep
            self.dropped += cut
            del self.buf[:cut]

    def value(self) -> bytes:
        if len(self.buf) > self.keep:
            self.dropped += len(self.buf) - self.keep
            return bytes(self.buf[-self.keep:])
        return bytes(self.buf)


class _Head(_Tail):
    """The first ``keep`` bytes written to it (a report read top down: a stack dump); the rest counted."""

    def add(self, chunk: bytes) -> None:
        room = self.keep - len(self.buf)
        self.buf += chunk[:max(0, room)]
        self.dropped += max(0, len(chunk) - max(0, room))


def drain(proc: subprocess.Popen[Any], *, timeout_s: float, stdin: bytes = b"", keep: int = KEEP_BYTES,
          stdout_head: bool = False) -> Drained:
    """Write ``stdin`` (then close it), read stdout/stderr (whichever are pipes) to tails of
    ``keep`` bytes (stdout's head instead with ``stdout_head``), and reap ``proc``, all within
    ``timeout_s``. Never raises for the child's doing (a closed stdin, a child gone); on the
    deadline the child is left running for the caller to kill (``timed_out``)."""
    deadline = time.monotonic() + timeout_s
    tails: dict[int, _Tail] = {}
    sel = selectors.DefaultSelector()
    pending = memoryview(stdin)
    try:
        for f in (proc.stdout, proc.stderr):
            if f is not None:
                os.set_blocking(f.fileno(), False)
                tails[f.fileno()] = _Head(keep) if stdout_head and f is proc.stdout else _Tail(keep)
                sel.register(f, selectors.EVENT_READ)
        if proc.stdin is not None:
            if pending:
                os.set_blocking(proc.stdin.fileno(), False)
                sel.register(proc.stdin, selectors.EVENT_WRITE)
            else:
                _close(proc.stdin)
        exited_at: float | None = None
        while sel.get_map():
            now = time.monotonic()
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            limit = deadline if exited_at is None else min(deadline, exited_at + GRACE_S)
            if now >= limit:
                break
            # Short waits while the child runs: its exit is noticed within 0.1 s even when a
            # grandchild keeps the pipes open and quiet.
            for key, _ in sel.select(min(limit - now, 0.1)):
                if proc.stdin is not None and key.fileobj is proc.stdin:
                    pending = _write(sel, proc.stdin, pending)
                    continue
                try:
                    chunk = os.read(key.fd, _CHUNK)
                except BlockingIOError:
                    continue
                if chunk:
                    tails[key.fd].add(chunk)
                else:
                    sel.unregister(key.fileobj)
    finally:
        sel.close()
    try:
        returncode: int | None = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        returncode = None
    out = tails[proc.stdout.fileno()].value() if proc.stdout is not None else b""
    err = tails[proc.stderr.fileno()].value() if proc.stderr is not None else b""
    for f in (proc.stdin, proc.stdout, proc.stderr):
        if f is not None:
            _close(f)
    return Drained(out, err, sum(t.dropped for t in tails.values()), returncode, returncode is None)


def _write(sel: selectors.BaseSelector, f: IO[bytes], pending: memoryview) -> memoryview:
    try:
        n = os.write(f.fileno(), pending[:_CHUNK])
        pending = pending[n:]
    except BlockingIOError:
        return pending
    except OSError:  # EPIPE: the child does not read its stdin; not its error to report here
        pending = pending[:0]
    if not pending:
        sel.unregister(f)
        _close(f)
    return pending


def _close(f: IO[bytes]) -> None:
    try:
        f.close()
    except OSError:
        pass


def kill_group(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL the child's process group (it was started in a session of its own: the group holds
    whatever it started) and reap the child."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # it ended meanwhile (and its group with it)
    try:
        proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        pass  # in uninterruptible sleep: the kernel reaps it later; nothing more we can do


def run(argv: list[str], *, timeout_s: float, keep: int = KEEP_BYTES, stdin: bytes = b"",
        stdout_head: bool = False, **popen: Any) -> Drained:
    """Start ``argv`` in a session of its own with piped stdout/stderr, :func:`drain` it, and kill
    its process group if it outlives ``timeout_s`` (``timed_out`` then). Raises OSError when it
    cannot start. The bounded ``subprocess.run(capture_output=True, timeout=...)``."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, **popen)
    res = drain(proc, timeout_s=timeout_s, stdin=stdin, keep=keep, stdout_head=stdout_head)
    if res.timed_out:
        kill_group(proc)
    return res
