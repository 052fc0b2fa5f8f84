"""One daemon per state dir: an exclusive ``flock`` on ``<state dir>/daemon.lock``.

Taken in :func:`supervisor.daemon.wiring.build_daemon` *before* the ledger is opened, so a
refused second daemon touches nothing of the live run (not the ledger, not the socket, not
the job). The lock lives on an open descriptor for the daemon's whole life: the kernel drops
it when the daemon exits, however it exits (``kill -9`` included), so a stale lock file never
blocks the next daemon.

Beside the flock the daemon holds a *name*: a listening abstract unix socket (Linux only) bound to
``tsup-state-`` + the sha256 of the state dir's absolute path. A name is not a file: deleting or
re-creating the state dir cannot drop it, and the kernel frees it when the daemon exits (``kill -9``
included), so it never goes stale. A second daemon on the same path -- the original or one
re-created after ``rm -rf`` -- finds the name taken and refuses (exit 2, ``in_use``) before it
touches anything; the holder's pid comes from the socket's peer credentials. (Abstract names are
per network namespace: two daemons in different namespaces on one shared state dir still meet at
the flock while the dir exists.) Why not a lock file elsewhere (``/run/lock``): it is one more
directory another user could own or clean up; the name needs no directory at all.

If the state dir is deleted while the daemon runs, the daemon notices it on every tick (the lock
file's link count drops to 0 or the path names another file) and says so loudly, once, as the
event ``state_dir_lost``: the job keeps running under this daemon (the name lock still keeps
every second daemon out), but ``status``/``stop`` cannot reach it through the socket in the
deleted dir; stop it with SIGTERM to its pid.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import socket
import struct
from pathlib import Path
from typing import Any

from ..errors import SupervisorError
from ..ownpaths import refuse_unsafe_as_root
from .ports import Concern

LOCK_NAME = "daemon.lock"


class StateDirLocked(SupervisorError):
    """Another live daemon holds this state dir; nothing was touched."""

    code = "in_use"


def ensure_state_dir(state_dir: Path) -> None:
    """Create the state dir 0700 (parents as needed); refuse one owned by another user."""
    refuse_unsafe_as_root(state_dir, "state dir")  # before mkdir: nothing is made under a bad parent
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    refuse_unsafe_as_root(state_dir, "state dir")
    st = os.stat(state_dir)
    if st.st_uid != os.geteuid() and os.geteuid() != 0:
        raise StateDirLocked(f"state dir {state_dir} is owned by uid {st.st_uid}, not by this user "
                             f"(uid {os.geteuid()}); refusing to use it: choose a state dir of your own")


def lock_name(state_dir: Path) -> bytes:
    """The abstract socket name for a state dir (its absolute path, as given: resolved by the caller)."""
    digest = hashlib.sha256(os.fsencode(os.path.abspath(state_dir))).hexdigest()[:40]
    return b"\0tsup-state-" + digest.encode()


def take_name(state_dir: Path) -> socket.socket | None:
    """Bind the state dir's abstract name, or raise :class:`StateDirLocked` naming the holder.
    None where abstract sockets do not exist (not Linux): the flock alone then guards the dir."""
    if not hasattr(socket, "AF_UNIX") or not os.uname().sysname == "Linux":
        return None
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # not inherited by the job (PEP 446)
    try:
        s.bind(lock_name(state_dir))
        s.listen(1)
        return s
    except OSError as e:
        s.close()
        if e.errno != errno.EADDRINUSE:
            return None  # e.g. a sandbox without abstract sockets: the flock still guards the dir
    raise StateDirLocked(
        f"another daemon (pid {_holder(state_dir)}) is already running for state dir {state_dir} "
        f"(its state dir may have been deleted and re-created since it started); nothing was changed. "
        f"Stop it first (SIGTERM that pid, or transformer-supervisor stop --state-dir {state_dir}) "
        f"or use another state dir")


def _holder(state_dir: Path) -> str:
    """The name holder's pid, from the peer credentials of a connection to it."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
            c.settimeout(1.0)
            c.connect(lock_name(state_dir))
            pid, _uid, _gid = struct.unpack("3i", c.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                                struct.calcsize("3i")))
            return str(pid)
    except OSError:
        return "unknown"


class StateLock:
    """The held lock: ``fd`` stays open until :meth:`release` (or process exit)."""

    def __init__(self, state_dir: Path, fd: int, name: socket.socket | None = None) -> None:
        self.state_dir = state_dir
        self.name = name  # the abstract-socket name lock (None where the platform has none)
        self.path = state_dir / LOCK_NAME
        self.fd = fd
        st = os.fstat(fd)
        self._ident = (st.st_dev, st.st_ino)

    @classmethod
    def acquire(cls, state_dir: Path) -> "StateLock":
        name = take_name(state_dir)
        try:
            return cls._acquire_file(state_dir, name)
        except BaseException:
            if name is not None:
                name.close()
            raise

    @classmethod
    def _acquire_file(cls, state_dir: Path, name: socket.socket | None) -> "StateLock":
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
        return cls(state_dir, fd, name)

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
        if self.name is not None:
            self.name.close()  # frees the name at once
            self.name = None
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
        guard = ("a second daemon on this path is refused while this one lives" if self.lock.name is not None
                 else "a second daemon on this path would start a second copy of the job: do not start one")
        msg = (f"{why} while this daemon (pid {os.getpid()}) runs: the job keeps running under it, "
               f"but `status` and `stop` cannot reach it; {guard}. Stop this daemon with SIGTERM to "
               f"pid {os.getpid()} before starting another")
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
