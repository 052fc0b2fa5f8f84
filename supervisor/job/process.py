"""The job process: spawn in its own session, pipe its output, classify how it ended."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Mapping, Sequence

from ..core.messages import ExitInfo
from ..events import Cause
from .osapi import OsApi, ProcRef, signal_name
from .output import PipePump, SinkFanout

SECRET_MARKERS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")


def is_secret(name: str) -> bool:
    up = name.upper()
    return any(m in up for m in SECRET_MARKERS)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: ("<redacted>" if is_secret(k) else v) for k, v in env.items()}


@dataclass(frozen=True)
class LaunchSpec:
    """Exactly what is exec'd: recorded in the ledger before the spawn."""

    argv: tuple[str, ...]
    cwd: str
    env: Mapping[str, str]  # the full environment of the job
    added_env: Mapping[str, str]  # what we added on top of the daemon's (for the ledger)


class JobProcess:
    """One running attempt: the leader process, its group, and the pumps reading its pipes."""

    def __init__(self, spec: LaunchSpec, fanout: SinkFanout, passthrough: BinaryIO | None,
                 log_path: Path | None, on_eof: Callable[[str], None], osapi: OsApi) -> None:
        self.spec = spec
        self.osapi = osapi
        self._out_lock = threading.Lock()
        self._logfile: BinaryIO | None = None
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            # Never through a symlink (one planted at job.log would make the daemon append the
            # job's output to any file it can write), and 0600 whatever the umask.
            fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            self._logfile = os.fdopen(fd, "ab", buffering=1 << 16)
        try:
            self.popen = subprocess.Popen(
                list(spec.argv), cwd=spec.cwd, env=dict(spec.env), stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, close_fds=True,
                bufsize=0,
            )
        except BaseException:
            if self._logfile:
                self._logfile.close()
            raise
        self.pid = self.popen.pid
        self.pgid = self.pid  # start_new_session: the leader's pid is the session and group id
        self.leader = osapi.proc_ref(self.pid) or ProcRef(self.pid, 0.0)
        self.known: dict[int, ProcRef] = {self.pid: self.leader}
        assert self.popen.stdout is not None and self.popen.stderr is not None
        # Detach the fds from Popen's file objects: the pumps own and close them.
        out_fd = os.dup(self.popen.stdout.fileno())
        err_fd = os.dup(self.popen.stderr.fileno())
        self.popen.stdout.close()
        self.popen.stderr.close()
        self.pumps = [
            PipePump(out_fd, "stdout", passthrough, self._logfile, self._out_lock, fanout, on_eof),
            PipePump(err_fd, "stderr", passthrough, self._logfile, self._out_lock, fanout, on_eof),
        ]
        for p in self.pumps:
            p.start()
        self.status: int | None = None
        self._tree_at = float("-inf")

    # -- observation ----------------------------------------------------------------------
    def refresh_tree(self, now: float) -> None:
        """Remember every descendant we can see (with its start time), so that processes that
        leave the group (setsid) are still found and stopped, and a reused pid never is.
        A /proc walk costs milliseconds: twice a second is enough."""
        if now - self._tree_at < 0.5:
            return
        self._tree_at = now
        if self.status is None:
            for ref in self.osapi.descendants(self.pid):
                self.known.setdefault(ref.pid, ref)
        self._adopt_orphans()

    def _adopt_orphans(self) -> None:
        """A grandchild that double-forks is re-parented to the daemon (the subreaper) before a
        walk of the leader's tree can see it: the daemon's own children that carry this
        attempt's TSUP_RUN_ID and TSUP_ATTEMPT in their environment are the job's too."""
        marker = [f"{k}={self.spec.env[k]}".encode() for k in ("TSUP_RUN_ID", "TSUP_ATTEMPT") if k in self.spec.env]
        if len(marker) < 2:
            return
        for ref in self.osapi.descendants(os.getpid()):
            if ref.pid in self.known or ref.pid == self.pid:
                continue
            try:
                with open(f"/proc/{ref.pid}/environ", "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            if all(m in env for m in marker):
                self.known[ref.pid] = ref

    def pids(self) -> list[int]:
        return [r.pid for r in self.known.values() if r.alive()]

    def poll(self) -> int | None:
        """Reap the leader if it exited; returns its raw wait status once known."""
        if self.status is None:
            st = self.osapi.reap(self.pid)
            if st is not None:
                self.status = st
                self.popen.returncode = os.waitstatus_to_exitcode(st)
        return self.status

    def group_alive(self) -> bool:
        if self.poll() is None:
            return True
        # Fast path: signal 0 to the group. ESRCH means nobody is left (not even a zombie); only
        # when something answers do we pay for the full scan that tells zombies from the living.
        if self.osapi.killpg(self.pgid, 0) and self.osapi.group_members(self.pgid):
            return True
        return any(r.alive() for pid, r in self.known.items() if pid != self.pid)

    def signal_group(self, sig: int) -> None:
        self._adopt_orphans()
        self.osapi.killpg(self.pgid, sig)
        # Descendants that moved to their own session are not in the group: signal them directly.
        for pid, ref in list(self.known.items()):
            if pid != self.pid:
                try:
                    if os.getpgid(pid) != self.pgid:
                        self.osapi.kill(ref, sig)
                except (ProcessLookupError, PermissionError):
                    continue

    def reap_orphans(self) -> None:
        """As subreaper we inherit orphaned descendants; reap the ones that were the job's."""
        for pid in list(self.known):
            if pid != self.pid:
                self.osapi.reap(pid)

    def pumps_done(self, timeout: float = 0.0) -> bool:
        for p in self.pumps:
            p.join(timeout)
        return not any(p.is_alive() for p in self.pumps)

    def close(self) -> None:
        for p in self.pumps:
            p.join(2.0)
        if self._logfile is not None:
            with self._out_lock:
                try:
                    self._logfile.close()
                except OSError:
                    pass


_OOM_KILL = re.compile(r"(?:Out of memory|Memory cgroup out of memory): Killed process (\d+)|oom-kill:.*?task_memcg=.*?pid=(\d+)|oom-kill:.*?pid=(\d+)")


def kernel_oom_evidence(pids: Sequence[int]) -> str | None:
    """Look in the kernel log for the OOM killer naming one of the job's pids.

    /dev/kmsg needs root (or CAP_SYSLOG); without it we simply have no evidence and the exit
    stays a plain ``crash`` (killed by SIGKILL).
    """
    wanted = {str(p) for p in pids}
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    found = None
    try:
        while True:
            try:
                rec = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError:  # EPIPE when a record was overwritten: keep reading
                continue
            if not rec:
                break
            text = rec.decode("utf-8", "replace")
            m = _OOM_KILL.search(text)
            if m and (m.group(1) or m.group(2) or m.group(3)) in wanted:
                found = text.split(";", 1)[-1].strip()
    finally:
        os.close(fd)
    return found


def cgroup_oom_kills() -> int | None:
    """The oom_kill counter of our own cgroup (v2), or None when not readable."""
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    path = Path("/sys/fs/cgroup") / line.strip()[3:].lstrip("/") / "memory.events"
                    for ev in path.read_text().splitlines():
                        k, _, v = ev.partition(" ")
                        if k == "oom_kill":
                            return int(v)
    except (OSError, ValueError):
        return None
    return None


def classify_exit(status: int, pids_seen: Sequence[int], oom_kills_before: int | None) -> ExitInfo:
    """Exit code / killing signal -> cause. SIGKILL with OOM-killer evidence -> ``oom``."""
    code = os.waitstatus_to_exitcode(status)
    if code == 0:
        return ExitInfo(0, None, None, "exited 0")
    if code > 0:
        return ExitInfo(code, None, Cause.CRASH, f"exit {code}")
    sig = -code
    name = signal_name(sig)
    if sig == signal.SIGKILL:
        evidence = kernel_oom_evidence(pids_seen)
        if evidence is None and oom_kills_before is not None:
            after = cgroup_oom_kills()
            if after is not None and after > oom_kills_before:
                evidence = f"memory.events oom_kill {oom_kills_before} -> {after} in our cgroup"
        if evidence:
            return ExitInfo(None, name, Cause.OOM, f"killed by {name} (kernel OOM killer)", evidence)
    return ExitInfo(None, name, Cause.CRASH, f"killed by {name}")


def job_python(argv: Sequence[str], configured: str | None) -> str:
    """The Python the job runs with: configured, the command itself, a launcher's shebang, or ours."""
    if configured:
        return configured
    if argv:
        first = argv[0]
        base = os.path.basename(first)
        if base.startswith("python"):
            return first
        import shutil

        exe = shutil.which(first)
        if exe:
            try:
                with open(exe, "rb") as f:
                    head = f.readline(256)
                if head.startswith(b"#!") and b"python" in head:
                    return head[2:].decode().strip().split()[0]
            except OSError:
                pass
    return sys.executable
