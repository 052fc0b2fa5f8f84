"""One daemon per state dir: an exclusive ``flock`` on ``<state dir>/daemon.lock``.

Taken in :func:`supervisor.daemon.wiring.build_daemon` *before* the ledger is opened, so a
refused second daemon touches nothing of the live run (not the ledger, not the socket, not
the job). The lock lives on an open descriptor for the daemon's whole life: the kernel drops
it when the daemon exits, however it exits (``kill -9`` included), so a stale lock file never
blocks the next daemon.

Beside the flock the daemon holds a *name*: a listening abstract unix socket (Linux only) bound to
``tsup-state-`` + the sha256 of the root directory's identity and the state dir's absolute path
(see :func:`lock_name`). A name is not a file: deleting or
re-creating the state dir cannot drop it, and the kernel frees it when the daemon exits (``kill -9``
included), so it never goes stale. A second daemon on the same path -- the original or one
re-created after ``rm -rf`` -- finds the name taken and refuses (exit 2, ``in_use``) before it
touches anything; the holder's pid comes from the socket's peer credentials. (Abstract names are
per network namespace: two daemons in different namespaces on one shared state dir still meet at
the flock while the dir exists.) Why not a lock file elsewhere (``/run/lock``): it is one more
directory another user could own or clean up; the name needs no directory at all.

If the state dir is deleted (or replaced) while the daemon runs, the daemon notices it within a
second (the lock file's link count drops to 0 or the path names another file), says so once
(``state_dir_lost``) and *re-takes* the dir: re-creates it (0700, same owner and path-trust checks
as at start), takes a fresh flock there, moves the ledger into it (copied from the still-open
handle on the deleted file, so nothing is lost; a fresh ledger continuing the run where the copy
fails), re-creates the attempt's heartbeat folder and re-binds the control socket; the event
``state_dir_retaken`` says what was done. ``status``/``stop`` work again, and the name lock kept
every second daemon out meanwhile. When the folder itself is still there and only its files went
(an ``rm -rf`` in progress, or just the lock file removed), the re-take waits ``SETTLE_S`` so it
does not race the deletion. Where the dir cannot be re-taken (its parent gone read-only, owned by
another user, its lock held by a process we cannot see; tried again every second for
``GIVE_UP_AFTER_S``), a daemon that can neither record nor be
reached must not keep a job: ``state_dir_unusable`` says why, and the daemon stops its job as
SIGTERM would (exit 143).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import socket
import signal
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..errors import SupervisorError
from ..eventnames import EventName
from ..levels import Level
from ..logsite import log_helper
from ..ownpaths import file_identity, open_in, refuse_unsafe_as_root
from .effects import Effect, Note
from .plugin import Closes, Effects, GivesStatus, OnTicks, RunView, Tick

if TYPE_CHECKING:
    from ..ledger.store import Ledger

LOCK_NAME = "daemon.lock"


class StateDirLocked(SupervisorError):
    """Another live daemon holds this state dir; nothing was touched."""

    code = "in_use"


class StateDirUnusable(SupervisorError):
    """The state dir or its lock file cannot be created or written (permissions, a read-only
    mount, a file in the way): nothing was started; exit 2."""

    code = "state_dir"


def _unusable(state_dir: Path, path: Path, e: OSError) -> StateDirUnusable:
    return StateDirUnusable(
        f"cannot use the state dir {state_dir}: {path} cannot be created or written ({e.strerror or e}). "
        f"The state dir must be a folder the daemon's user can write (check its permissions and that its "
        f"filesystem is not mounted read-only), or choose another ([state] dir or --state-dir)")


def ensure_state_dir(state_dir: Path) -> int:
    """Create the state dir 0700 (parents as needed); refuse one owned by another user. A
    descriptor on the folder checked (the caller closes it): files made through it land there."""
    refuse_unsafe_as_root(state_dir, "state dir")  # before mkdir: nothing is made under a bad parent
    try:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        dfd = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:  # read-only parent, no permission, a file (or a link) at the name
        raise _unusable(state_dir, state_dir, e) from None
    try:
        refuse_unsafe_as_root(state_dir, "state dir")
        st = os.fstat(dfd)
        if st.st_uid != os.geteuid() and os.geteuid() != 0:
            raise StateDirLocked(f"state dir {state_dir} is owned by uid {st.st_uid}, not by this user "
                                 f"(uid {os.geteuid()}); refusing to use it: choose a state dir of your own")
    except BaseException:
        os.close(dfd)
        raise
    return dfd


def lock_name(state_dir: Path) -> bytes:
    """The abstract socket name for a state dir: its absolute path (as given: resolved by the
    caller) under this process's root directory. Abstract names are shared by every container
    on the host's network namespace (nspawn's default, docker's ``--network=host``); the root's
    (device, inode) tells their filesystems apart, so two containers that each use
    ``/var/lib/transformer-supervisor/job`` do not refuse each other (CI: one systemd container
    refused by another's daemon, "pid 0"). A service in a mount namespace of its own on the host's
    root (ProtectSystem=) shares the root, so it still meets a `wrap` on the same dir."""
    root = os.stat("/")
    ident = f"{root.st_dev}:{root.st_ino}:".encode() + os.fsencode(os.path.abspath(state_dir))
    return b"\0tsup-state-" + hashlib.sha256(ident).hexdigest()[:40].encode()


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


def _lock_file(state_dir: Path) -> tuple[int, tuple[int, int]]:
    """Create the state dir if needed and flock its lock file, made in the folder checked (not
    by name: a swap after the check cannot redirect it). The descriptor, holding our pid, and the
    folder's (device, inode)."""
    dfd = ensure_state_dir(state_dir)
    path = state_dir / LOCK_NAME
    try:
        st = os.fstat(dfd)
        fd = open_in(dfd, LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise StateDirLocked(f"{path} is a symlink; refusing to follow it") from None
        raise _unusable(state_dir, path, e) from None
    finally:
        os.close(dfd)
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
    return fd, (st.st_dev, st.st_ino)


class StateLock:
    """The held lock: ``fd`` stays open until :meth:`release` (or process exit)."""

    def __init__(self, state_dir: Path, fd: int, name: socket.socket | None = None,
                 dir_ident: tuple[int, int] | None = None) -> None:
        self.state_dir = state_dir
        self.name = name  # the abstract-socket name lock (None where the platform has none)
        self.path = state_dir / LOCK_NAME
        self.fd = fd
        st = os.fstat(fd)
        self._ident = (st.st_dev, st.st_ino)
        self._dir_ident = dir_ident or file_identity(state_dir)  # the folder the lock was made in

    @classmethod
    def acquire(cls, state_dir: Path) -> "StateLock":
        name = take_name(state_dir)
        try:
            return cls._acquire_file(state_dir, name)
        except StateDirUnusable as e:
            if name is not None:
                name.close()
            raise StateDirUnusable(f"{e.message}; nothing was started") from None
        except BaseException:
            if name is not None:
                name.close()
            raise

    @classmethod
    def _acquire_file(cls, state_dir: Path, name: socket.socket | None) -> "StateLock":
        fd, dir_ident = _lock_file(state_dir)
        return cls(state_dir, fd, name, dir_ident)

    def retake(self) -> None:
        """Re-create the state dir after it was deleted or replaced, and hold a fresh lock file in
        it (:class:`StateDirLocked` if some other process locked it first). Nothing to do when an
        earlier try already did (a later step of that re-take failed and is tried again)."""
        if self.lost() is None:
            return
        fd, self._dir_ident = _lock_file(self.state_dir)
        old, self.fd = self.fd, fd
        st = os.fstat(fd)
        self._ident = (st.st_dev, st.st_ino)
        if old >= 0:
            os.close(old)

    def dir_still_there(self) -> bool:
        """The path still names the folder the daemon started in (only files in it went)."""
        return file_identity(self.state_dir) == self._dir_ident

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


class StateLockPlugin(OnTicks, GivesStatus, Closes):
    """Holds the lock for the daemon's life; checks every tick that the state dir is still ours
    and re-takes it when it is not (see the module docstring); shows the ledger's dropped writes
    in ``status`` (and so in the metrics). ``rebind``: what re-opens its files in the re-created
    dir besides the lock and the ledger (the control socket)."""

    name = "state_lock"
    CHECK_EVERY_S = 1.0
    SETTLE_S = 5.0  # the folder itself still there: let a deletion in progress finish first
    # A failed re-take is tried again every check for this long (a folder being re-made by hand, a
    # moment's ENOSPC) before the daemon gives up and stops its job.
    GIVE_UP_AFTER_S = 5.0

    def __init__(self, lock: StateLock, ledger: Ledger | None = None, *, rebind: Sequence[Callable[[], None]] = (),
                 stop: Callable[[], None] | None = None) -> None:
        self.lock = lock
        self.ledger = ledger
        self.rebind = list(rebind)
        # How the job is stopped when the dir cannot be re-taken: SIGTERM to ourselves (the handler
        # queues it; the loop stops the job gracefully). Injected by tests.
        self.stop = stop or (lambda: os.kill(os.getpid(), signal.SIGTERM))
        self._next = 0.0
        self.reported: str | None = None  # why the dir is not ours (the episode in progress)
        self._lost_at = 0.0
        self.retaken = 0  # episodes ended by a re-take
        self.gave_up: str | None = None

    def tick(self, n: Tick, run: RunView) -> Effects:
        now = n.now
        if self.gave_up is not None or now < self._next or self.lock.fd < 0:
            return ()
        self._next = now + self.CHECK_EVERY_S
        said: list[Effect] = []
        if self.reported is None:
            why = self.lock.lost()
            if why is None:
                return ()
            self.reported, self._lost_at = why, now
            said.append(_note(EventName.STATE_DIR_LOST, Level.ERROR,
                              f"{why} while this daemon (pid {os.getpid()}) runs: the job keeps running under it; the "
                              f"daemon re-creates the state dir and moves its ledger and control socket there "
                              f"(state_dir_retaken follows), or stops the job if it cannot (state_dir_unusable)"))
        if self.lock.dir_still_there() and now - self._lost_at < self.SETTLE_S:
            return said
        return [*said, *self._retake(self.reported, now, run)]

    def _retake(self, why: str, now: float, run: RunView) -> Effects:
        try:
            self.lock.retake()
            done = [f"re-created {self.lock.state_dir} (mode 0700) with a fresh lock"]
            if self.ledger is not None:
                from ..job.launch import config_json

                done.append(self.ledger.retake(run.run_id, run.cfg.job.name, config_json(run.cfg)))
            if run.has_job:
                from ..job.launch import make_heartbeat_dir

                make_heartbeat_dir(self.lock.state_dir, run.attempt)
            for again in self.rebind:
                again()
        except Exception as e:  # whatever stops the re-take, the answer is the same
            return self._give_up(why, e) if now - self._lost_at >= self.GIVE_UP_AFTER_S else ()
        self.reported, self.retaken = None, self.retaken + 1
        return [_note(EventName.STATE_DIR_RETAKEN, Level.WARNING,
                      f"{why}: this daemon (pid {os.getpid()}) took it back: {'; '.join(done)}; the control socket "
                      f"is bound again (`status` and `stop` work). The job ran on throughout; its earlier output "
                      f"(job.log) and the checkpoint notes kept in the old dir are gone with it")]

    def _give_up(self, why: str, e: BaseException) -> Effects:
        self.gave_up = f"{why}; it cannot be re-created (tried for {self.GIVE_UP_AFTER_S:g} s): {e}"
        self.stop()  # only queues a SIGTERM: the note below is recorded before the loop stops the job
        return [_note(EventName.STATE_DIR_UNUSABLE, Level.ERROR,
                      f"{self.gave_up}. A daemon that can neither record nor be reached must not keep a job: it "
                      f"stops the job now as SIGTERM would (exit 143). Make {self.lock.state_dir} creatable "
                      f"and writable by this user, then start again (the job resumes from its newest checkpoint)")]

    def status(self, run: RunView) -> dict[str, Any]:
        led = self.ledger
        return {"state_dir_lost": self.gave_up or self.reported, "state_dir_retaken": self.retaken,
                "ledger_write_errors": led.write_errors if led is not None else 0,
                # writes waiting for another process's lock on the ledger (ledger/deferred.py)
                "ledger_writes_waiting": led.deferred.waiting if led is not None and led.deferred is not None else 0,
                "ledger_failing": led.failing if led is not None else None}

    def close(self) -> None:
        self.lock.release()


@log_helper
def _note(event: EventName, level: Level, msg: str) -> Note:
    # The ledger lived in that dir: a write that fails there is counted and dropped, the log line still goes out.
    return Note(event, level, msg, {"pid": os.getpid()})
