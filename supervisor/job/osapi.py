"""The OS boundary: signals, process lookups, clocks.

Everything that touches another process goes through :class:`OsApi`, so tests can record
kills, inject ``OSError(ESRCH)`` or a fake clock, while integration tests use the real thing.
ESRCH ("no such process") always means "already gone", never an error.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class ProcRef:
    """A process identified by pid AND start time, so a reused pid is never mistaken for it."""

    pid: int
    create_time: float

    def alive(self) -> bool:
        try:
            p = psutil.Process(self.pid)
            return abs(p.create_time() - self.create_time) < 0.05 and p.status() != psutil.STATUS_ZOMBIE
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return False


class Clock:
    """Monotonic time for deadlines, wall time for the ledger."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class OsApi:
    def killpg(self, pgid: int, sig: int) -> bool:
        """Signal a process group. Returns False when the group is already gone."""
        try:
            os.killpg(pgid, sig)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            # EPERM on a group means some member is not ours (or a zombie-only group on some
            # kernels); treat as gone for our purposes only if no live member exists.
            return bool(self.group_members(pgid))

    def kill(self, ref: ProcRef, sig: int) -> bool:
        if not ref.alive():
            return False
        try:
            os.kill(ref.pid, sig)
            return True
        except ProcessLookupError:
            return False

    def group_members(self, pgid: int) -> list[int]:
        """Live (non-zombie) processes whose process group is ``pgid``."""
        out = []
        for p in psutil.process_iter(["status"]):
            try:
                if p.info["status"] == psutil.STATUS_ZOMBIE:
                    continue
                if os.getpgid(p.pid) == pgid:
                    out.append(p.pid)
            except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
                continue
        return out

    def started_after(self, pid: int, t: float) -> bool:
        """True when ``pid`` lives and was started at or after wall time ``t``."""
        try:
            return psutil.Process(pid).create_time() >= t
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False

    def proc_ref(self, pid: int) -> ProcRef | None:
        try:
            return ProcRef(pid, psutil.Process(pid).create_time())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return None

    def descendants_of(self, roots: tuple[int, ...]) -> dict[int, list[ProcRef]]:
        """Each root's descendants, from one pass over /proc. psutil's ``children(recursive=True)``
        builds a parent map of the whole host per call (one read per process); two roots asked
        every half second doubled a cost that grows with the host, so the map is built once here
        (psutil keeps its own map private), and psutil gives the start times of the few found."""
        kids: dict[int, list[int]] = {}
        for pid in psutil.pids():
            ppid = _parent(pid)
            if ppid is not None:
                kids.setdefault(ppid, []).append(pid)
        out: dict[int, list[ProcRef]] = {}
        for root in roots:
            found: list[ProcRef] = []
            todo = list(kids.get(root, ()))
            while todo:
                pid = todo.pop()
                ref = self.proc_ref(pid)
                if ref is not None:
                    found.append(ref)
                    todo.extend(kids.get(pid, ()))
            out[root] = found
        return out

    def reap(self, pid: int) -> int | None:
        """Non-blocking waitpid; the raw status, or None while it runs (or when not our child)."""
        try:
            got, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return None
        return status if got == pid else None


def _parent(pid: int) -> int | None:
    """The parent pid from ``/proc/<pid>/stat`` (the field after the state; the command name
    before them may hold spaces and parentheses, so split after its last ``)``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Orphaned descendants of the job get re-parented to us (not init), so we can find and
    reap them: nothing of a job survives a relaunch, and no zombie is left behind."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"SIG{sig}"

