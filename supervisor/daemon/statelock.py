"""One daemon per state dir: an exclusive ``flock`` on ``<state dir>/daemon.lock``.

Taken in :func:`supervisor.daemon.wiring.build_daemon` *before* the ledger is opened, so a
refused second daemon touches nothing of the live run (not the ledger, not the socket, not
the job). The lock lives on an open descriptor for the daemon's whole life: the kernel drops
it when the daemon exits, however it exits (``kill -9`` included), so a stale lock file never
blocks the next daemon.

If the state dir is deleted while the daemon runs, the lock stays held on the (now unlinked)
file, but a second daemon on the re-created path would see no lock. The daemon cannot prevent
that; it notices it on every tick (the lock file's link count drops to 0 or the path names
another file) and says so loudly, once, as the event ``state_dir_lost``: the job keeps
running under this daemon, and the operator must not start another one on that path.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from typing import Any

from ..errors import SupervisorError
from .ports import Concern

LOCK_NAME = "daemon.lock"


class StateDirLocked(SupervisorError):
    """Another live daemon holds this state dir; nothing was touched."""

    code = "in_use"


def ensure_state_dir(state_dir: Path) -> None:
    """Create the state dir 0700 (parents as needed); refuse one owned by another user."""
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.stat(state_dir)
    if st.st_uid != os.geteuid() and os.geteuid() != 0:
        raise StateDirLocked(f"state dir {state_dir} is owned by uid {st.st_uid}, not by this user "
                             f"(uid {os.geteuid()}); refusing to use it: choose a state dir of your own")


class StateLock:
    """The held lock: ``fd`` stays open until :meth:`release` (or process exit)."""

    def __init__(self, state_dir: Path, fd: int) -> None:
        self.state_dir = state_dir
        self.path = state_dir / LOCK_NAME
        self.fd = fd
        st = os.fstat(fd)
        self._ident = (st.st_dev, st.st_ino)

    @classmethod
    def acquire(cls, state_dir: Path) -> "StateLock":
        ensure_state_dir(state_dir)
        path = state_dir / LOCK_NAME
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise StateDirLocked(f"{path} is a symlink; refusing to follow it") from None
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            finally:
                os.close(fd)
            raise StateDirLocked(
                f"another daemon (pid {holder}) is already running for state dir {state_dir}; "
                f"nothing was changed. Stop it first (transformer-supervisor stop --state-dir {state_dir}) "
                f"or use another state dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(state_dir, fd)

    def lost(self) -> str | None:
        """Why the state dir no longer is ours (None while it is)."""
        try:
            if os.fstat(self.fd).st_nlink == 0:
                return f"the state dir {self.state_dir} (or its lock file) was deleted"
            st = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return f"the state dir {self.state_dir} (or its lock file) was deleted"
        except OSError as e:
            return f"the state dir {self.state_dir} cannot be read: {e}"
        if (st.st_dev, st.st_ino) != self._ident:
            return f"the state dir {self.state_dir} was replaced"
        return None

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing the descriptor drops the flock
            self.fd = -1

    def __del__(self) -> None:
        self.release()


class StateLockConcern(Concern):
    """Holds the lock for the daemon's life; checks every tick that the state dir is still ours;
    shows the ledger's dropped writes in ``status`` (and so in the metrics)."""

    name = "state_lock"
    CHECK_EVERY_S = 1.0

    def __init__(self, lock: StateLock, ledger: Any = None) -> None:
        self.lock = lock
        self.ledger = ledger
        self._daemon: Any = None
        self._next = 0.0
        self.reported: str | None = None

    def start(self, daemon: Any) -> None:
        self._daemon = daemon

    def tick(self, now: float) -> None:
        if self.reported is not None or now < self._next or self.lock.fd < 0:
            return
        self._next = now + self.CHECK_EVERY_S
        why = self.lock.lost()
        if why is None:
            return
        self.reported = why
        msg = (f"{why} while this daemon (pid {os.getpid()}) runs: the job keeps running under it, "
               f"but `status` cannot reach it and a second daemon on this path would start a second "
               f"copy of the job. Do not start one: stop this daemon (SIGTERM pid {os.getpid()}) first")
        try:
            self._daemon.event("state_dir_lost", "error", msg, pid=os.getpid())
        except Exception:  # noqa: BLE001 - the ledger lived in that dir; the log line still goes out
            import structlog

            structlog.get_logger("supervisor").error("state_dir_lost", message=msg, pid=os.getpid())

    def status(self) -> dict[str, Any]:
        led = self.ledger
        return {"state_dir_lost": self.reported,
                "ledger_write_errors": getattr(led, "write_errors", 0),
                "ledger_failing": getattr(led, "failing", None)}

    def close(self) -> None:
        self.lock.release()
