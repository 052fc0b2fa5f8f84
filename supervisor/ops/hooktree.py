"""Everything a ``[notify]`` hook command starts, ended with it (issue 34, the fourth round).

A hook runs in a session of its own, and killing its process group was the whole cleanup; but a
child that moves to a new session (``setsid sleep 1000 &``, Python's ``start_new_session=True``,
a double fork) leaves that group and outlived the hook's timeout and the daemon's exit. So each
hook run has a :class:`HookTree` that knows all of its processes, however they detach:

- a cgroup (v2) of its own where the daemon may create one (the job's rule: a child of the
  daemon's cgroup, ``tsup-hook-<daemon pid>-<n>``): the hook enters it between fork and exec, so
  everything it starts is born there and stays whatever session it makes; the end is
  ``cgroup.kill``;
- always, a marker in its environment (``TSUP_HOOK=<daemon pid>-<n>``) that its descendants
  inherit: at the end every process that carries it is killed (one pass over ``/proc``), so
  without a cgroup only a descendant that both leaves the session and scrubs its environment
  escapes (said in docs/reliability.md).

When it ends: as soon as the hook's try is over, whatever its outcome (the hook exited, ran past
its ``timeout_s``, or was cut at the daemon's exit). A hook is done when it exits, as a systemd
oneshot unit's control group is: what it left running in the background is killed then, never
left to outlive its timeout or the daemon (a hook that must send in the background should send
in the foreground: the try's deadline is what bounds it). Killed processes that were re-parented
to the daemon (its subreaper) are reaped here.
"""
from __future__ import annotations

import itertools
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable

from ..job.cgroup import JobCgroup, own_cgroup

MARKER = "TSUP_HOOK"
PREFIX = "tsup-hook-"
#: How long the end waits for killed processes to leave the cgroup and to be reaped.
END_WAIT_S = 2.0
_seq = itertools.count(1)
_parent: tuple[Path | None, str] | None = None  # the daemon's cgroup, looked up once


def _cgroup_parent() -> Path | None:
    global _parent
    if _parent is None:
        _parent = own_cgroup()
    return _parent[0]


class HookTree:
    """One hook run's processes: its marker and, where one can be made, its cgroup."""

    def __init__(self, use_cgroup: bool = True, find_parent: Callable[[], Path | None] = _cgroup_parent) -> None:
        self.tag = f"{os.getpid()}-{next(_seq)}"
        self.marker = f"{MARKER}={self.tag}".encode()
        self.cgroup: JobCgroup | None = None
        self._procs_fd = -1
        self._lock = threading.Lock()  # the try's cut (another thread) and the hook's own end may meet
        parent = find_parent() if use_cgroup else None
        if parent is not None:
            try:
                path = parent / f"{PREFIX}{self.tag}"
                path.mkdir(mode=0o755)
                self.cgroup = JobCgroup(path)
                self._procs_fd = self.cgroup.procs_fd()
            except OSError:  # its processes are found by its group and the marker in their environment
                self._forget_cgroup()

    def env(self, env: dict[str, str]) -> dict[str, str]:
        """The hook's environment with the marker its descendants inherit."""
        return {**env, MARKER: self.tag}

    def popen_kw(self) -> dict[str, Any]:
        """What ``Popen`` needs to start the hook inside its cgroup (nothing without one)."""
        fd = self._procs_fd
        if fd < 0:
            return {}
        return {"preexec_fn": lambda: _enter(fd)}

    def started(self) -> None:
        """The hook is started: the cgroup.procs fd is no longer needed."""
        if self._procs_fd >= 0:
            os.close(self._procs_fd)
            self._procs_fd = -1

    def end_unstarted(self) -> None:
        """The hook could not be started: its cgroup goes."""
        self._forget_cgroup()

    def end(self, proc: subprocess.Popen[Any]) -> list[int]:
        """Kill everything the hook started, however it detached, and reap what is ours to reap;
        the pids killed besides the hook itself."""
        with self._lock:
            return self._end(proc)

    def _end(self, proc: subprocess.Popen[Any]) -> list[int]:
        self.started()
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        killed: set[int] = set()
        if self.cgroup is not None:
            killed.update(self.cgroup.pids())
            self.cgroup.signal(signal.SIGKILL)
        marked = self._marked()
        for pid in marked:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue
        killed.update(marked)
        killed.discard(proc.pid)
        try:
            proc.wait(timeout=END_WAIT_S)
        except subprocess.TimeoutExpired:
            pass  # in uninterruptible sleep: the kernel reaps it later
        self._reap(killed)
        if self.cgroup is not None:
            deadline = time.monotonic() + END_WAIT_S
            while self.cgroup.populated() and time.monotonic() < deadline:
                time.sleep(0.01)  # SIGKILLed processes leave in milliseconds
            if self.cgroup.remove():
                self.cgroup = None
        return sorted(killed)

    def _marked(self) -> list[int]:
        """The processes whose environment carries this run's marker (not us)."""
        me, found = os.getpid(), list[int]()
        try:
            pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
        except OSError:
            return found
        for pid in pids:
            if pid == me:
                continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read()
            except OSError:
                continue
            if self.marker in env.split(b"\0"):
                found.append(pid)
        return found

    @staticmethod
    def _reap(pids: set[int]) -> None:
        """Reap the killed ones re-parented to us (the daemon is a subreaper): each by its pid, never
        a wait for any child (that could take the job's exit status)."""
        deadline = time.monotonic() + END_WAIT_S
        left = set(pids)
        while left and time.monotonic() < deadline:
            for pid in list(left):
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:  # not our child (re-parented elsewhere) or reaped already
                    left.discard(pid)
                    continue
                if done:
                    left.discard(pid)
            if left:
                time.sleep(0.01)

    def _forget_cgroup(self) -> None:
        if self._procs_fd >= 0:
            os.close(self._procs_fd)
            self._procs_fd = -1
        if self.cgroup is not None:
            self.cgroup.remove()
            self.cgroup = None


def _enter(procs_fd: int) -> None:
    """Between fork and exec, in the hook: into its cgroup (only a write to an fd opened before the
    fork; a failure leaves the marker to find its processes)."""
    try:
        os.write(procs_fd, b"0")
    except OSError:
        pass
