"""The warm verifier: one long-lived load-test process per job interpreter.

A cold load test starts the job's Python and imports torch for every checkpoint: on a busy
2-core machine that was 14.5 s for a 1.3 MB file, more than the interval between two saves, so
saves went unverified (and, for a single overwritten file, unkept). The warm process
(``_loadtest_script.py --serve``) imports torch once and answers one request per line; a load
costs the load.

Rules, each for a reason:
- One request at a time. A second caller while it is busy gets ``None`` and runs a cold test
  beside it: a restart's checkpoint choice must not wait behind a background test.
- Any doubt -> cold. A process that died answers nothing; the caller runs the same request cold,
  which reports the real error (its stderr). After ``MAX_CRASHES`` deaths in a row the warm path
  is off for good (an interpreter without torch, a loader that crashes it).
- A timeout kills the process group, as for a cold test; the next request starts a fresh one.
- Idle for ``idle_s`` -> closed, so a torch-sized process does not sit beside the job for the
  whole run between rare saves. It runs as the daemon's user, for this daemon only (never shared).
- Same priority rules as a cold test (the script lowers its own nice and session group first).
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import structlog

log = structlog.get_logger("supervisor.checkpoints")

_SCRIPT = Path(__file__).with_name("_loadtest_script.py")
MARKER = b"TSUP_LOADTEST_RESULT "
MAX_CRASHES = 2
#: The longest stdout line kept while looking for the result line (a reply is a few KiB): what a
#: load prints without a newline past this is dropped, so it costs no more than this.
LINE_BYTES = 1 << 20
IDLE_S = 300.0


@dataclass(frozen=True)
class WarmReply:
    """What the warm process said: its result line's JSON, or that it ran out of time."""

    data: dict[str, Any] | None
    timed_out: bool = False


class WarmVerifier:
    """One warm load-test process for ``python`` in ``cwd``, started on first use."""

    def __init__(self, python: str, cwd: Path | None, *, idle_s: float = IDLE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.python, self.cwd, self.idle_s, self._clock = python, cwd, idle_s, clock
        self._busy = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._buf = b""
        self._crashes = 0
        self._closed = False
        self._last_used = clock()
        self._idle_timer: threading.Timer | None = None
        self.served = 0  # requests answered warm (status, tests)

    @property
    def available(self) -> bool:
        return not self._closed and self._crashes < MAX_CRASHES

    def request(self, payload: str, timeout_s: float,
                started: Callable[[subprocess.Popen[bytes]], None] | None = None) -> WarmReply | None:
        """The reply to one request; ``None`` when the caller should run it cold (busy, off,
        closed, or the process died on it)."""
        if not self.available or not self._busy.acquire(blocking=False):
            return None
        try:
            proc = self._ensure_started()
            if proc is None:
                return None
            if started is not None:
                started(proc)
            try:
                assert proc.stdin is not None
                proc.stdin.write(payload.encode() + b"\n")
                proc.stdin.flush()
            except OSError:  # BrokenPipeError included: it died before the request
                self._died()
                return None
            reply = self._read_reply(proc, timeout_s)
            if reply is None:
                self._died()
                return None
            if not reply.timed_out:
                self._crashes = 0
                self.served += 1
            return reply
        finally:
            self._last_used = self._clock()
            self._busy.release()
            self._arm_idle_timer()

    def close(self) -> None:
        """Stop the process (the supervisor is exiting, or it was idle); no new one starts after
        an exit close."""
        self._closed = True
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        proc = self._proc
        if proc is not None:  # a request under way reads EOF and cleans up after itself
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self._busy.acquire(blocking=False):
            try:
                self._stop()
            finally:
                self._busy.release()

    # -- the process ------------------------------------------------------------------------------

    def _ensure_started(self) -> subprocess.Popen[bytes] | None:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._proc, self._buf = None, b""
        env = dict(os.environ)
        env.setdefault("CUDA_VISIBLE_DEVICES", "")  # a load test must not grab a GPU the job needs
        env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", "1")
        try:
            self._proc = subprocess.Popen([self.python, "-c", _SCRIPT.read_text(), "--serve"], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=self.cwd, env=env,
                                          start_new_session=True)
        except OSError as exc:
            self._crashes = MAX_CRASHES  # it cannot start at all: the cold path says why, every time
            log.info("warm_verifier_off", python=self.python, error=str(exc.strerror or exc),
                     next="each load test starts its own process")
            return None
        return self._proc

    def _read_reply(self, proc: subprocess.Popen[bytes], timeout_s: float) -> WarmReply | None:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        deadline = self._clock() + timeout_s
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while True:
                while b"\n" in self._buf:
                    line, self._buf = self._buf.split(b"\n", 1)
                    if line.startswith(MARKER):
                        try:
                            data = json.loads(line[len(MARKER):])
                        except ValueError:
                            return None
                        return WarmReply(data if isinstance(data, dict) else None)
                left = deadline - self._clock()
                if left <= 0:
                    self._stop()
                    return WarmReply(None, timed_out=True)
                if not sel.select(min(left, 1.0)):
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    return None  # it died (or was killed by a cancel)
                self._buf += chunk
                if len(self._buf) > LINE_BYTES and b"\n" not in self._buf:
                    self._buf = b""  # a line too long to be a reply: dropped, not kept growing

    def _died(self) -> None:
        self._stop()
        if not self._closed:
            self._crashes += 1
            log.info("warm_verifier_died", python=self.python, crashes=self._crashes,
                     next="this request runs cold" + ("; the warm verifier is off" if not self.available else ""))

    def _stop(self) -> None:
        proc, self._proc, self._buf = self._proc, None, b""
        _kill(proc)

    def _arm_idle_timer(self) -> None:
        if self._closed or self.idle_s <= 0:
            return
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        self._idle_timer = threading.Timer(self.idle_s, self._close_if_idle)
        self._idle_timer.daemon = True
        self._idle_timer.start()

    def _close_if_idle(self) -> None:
        if not self._busy.acquire(blocking=False):
            return  # in use: the request's end arms the timer again
        try:
            idle = self._proc is not None and self._clock() - self._last_used >= self.idle_s
            proc, self._buf = (self._proc, b"") if idle else (None, self._buf)
            if idle:
                self._proc = None
        finally:
            self._busy.release()
        if proc is not None:  # killed outside the lock: a request meanwhile starts a fresh one at once
            log.info("warm_verifier_idle", idle_s=self.idle_s, next="the next load test starts it again")
            _kill(proc)


def _kill(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the group holds what it started
    except (ProcessLookupError, PermissionError):
        pass
    for f in (proc.stdin, proc.stdout):
        try:
            if f is not None:
                f.close()
        except OSError:
            pass
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass
