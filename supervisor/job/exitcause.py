"""How the job's process ended, as a cause: an exit code, a killing signal, and for a SIGKILL the
OOM killer's evidence (the kernel log, our cgroup's oom_kill counter)."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import Sequence

from ..core.messages import ExitInfo
from ..events import Cause
from .osapi import signal_name

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
