"""The job in a cgroup (v2) of its own, where the daemon may create one.

Process groups, sessions and the subreaper find what the job starts as long as it stays in the
job's group, or carries the attempt's TSUP_RUN_ID/TSUP_ATTEMPT (see
:meth:`~supervisor.job.process.JobProcess._walk_now`). A process that leaves the session
*and* scrubs its environment escapes them. A cgroup does not let it: every process the job
starts is born in the job's cgroup and stays there whatever it does, so a stop is "every pid in
``cgroup.procs``" and the final blow is ``cgroup.kill`` (Linux 5.14+; a SIGKILL to each pid
before). Where cgroup v2 is not writable for us (cgroup v1 only, a read-only /sys/fs/cgroup, a
cgroup not delegated to us), the subreaper tracking stays the way, and the daemon says so once.

Where: a child of the daemon's own cgroup, so it is ours to create. Under systemd that needs
``Delegate=yes`` (the shipped units have it); as root in a container the cgroup namespace's root
is ours. The child is created per attempt, named ``tsup-<run id>-<attempt>``, and removed once
empty; the leftovers of a previous daemon life of the same run are stopped and removed before
the next attempt starts.

Background verification (the load tests of each save) gets a sibling, ``tsup-verify-<daemon pid>``
(:class:`VerifierCgroup`), weighted to take CPU and IO only where the job leaves them idle
(``cpu.idle``, ``cpu.weight`` 1, ``io.weight`` 1: those of them the delegated controllers offer).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Callable

import structlog

log = structlog.get_logger("supervisor.job.cgroup")

SWEEP_WAIT_S = 2.0  # how long a sweep waits for killed leftovers to leave their cgroup


def _cgroup2_mount() -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup, or /sys/fs/cgroup/unified in
    the hybrid layout), from our mountinfo."""
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                if right.split(" ", 1)[0] == "cgroup2":
                    return Path(left.split()[4])
    except OSError:
        return None
    return None


def unit_path(path: Path) -> str:
    """``path`` as a unit file spells it: systemd's parser drops a lone backslash (the "\\x2d" of
    an instance's slice, system-transformer\\x2dsupervisor.slice, is written "\\\\x2d")."""
    return str(path).replace("\\", "\\\\")


def own_cgroup() -> tuple[Path | None, str]:
    """The daemon's own cgroup v2 directory when we may create cgroups in it; else None and why."""
    try:
        with open("/proc/self/cgroup") as f:
            rel = next((line.strip()[3:] for line in f if line.startswith("0::")), None)
    except OSError as e:
        return None, f"cannot read /proc/self/cgroup ({e})"
    mount = _cgroup2_mount()
    if rel is None or mount is None:
        return None, "no cgroup v2 hierarchy (cgroup v1 only)"
    path = mount / rel.lstrip("/")
    if not (path / "cgroup.procs").exists():
        return None, f"our cgroup {path} is not visible here"
    if not os.access(path, os.W_OK):
        return None, (f"our cgroup {path} is not writable (not delegated: under systemd it needs Delegate=yes, "
                      f"and with ProtectControlGroups=yes a ReadWritePaths=-{unit_path(path)} in the unit)")
    return path, ""


class JobCgroup:
    """One attempt's cgroup: who is in it, signals to all of them, removal once empty."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, parent: Path, name: str) -> "JobCgroup":
        """Make ``parent/name`` (raises OSError when we may not); leftovers of an earlier life of
        the same run (``name``'s prefix up to the attempt) are stopped and removed first."""
        sweep(parent, name.rsplit("-", 1)[0] + "-")
        path = parent / name
        path.mkdir(mode=0o755)
        return cls(path)

    def procs_fd(self) -> int:
        """An fd on ``cgroup.procs``: the child writes "0" to it between fork and exec, so the job
        is in its cgroup before its first instruction (nothing it forks can be born outside)."""
        return os.open(self.path / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)

    def pids(self) -> list[int]:
        try:
            return [int(x) for x in (self.path / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def populated(self) -> bool:
        """Any live process in it (exited ones leave at once, reaped or not)."""
        try:
            for line in (self.path / "cgroup.events").read_text().splitlines():
                if line.startswith("populated "):
                    return line.split()[1] == "1"
        except OSError:
            return False
        return bool(self.pids())

    def signal(self, sig: int) -> set[int]:
        """``sig`` once to every process in it; the pids it reached (the caller must not signal
        them again: a second SIGUSR1 is a second emergency checkpoint)."""
        pids = self.pids()
        if sig == signal.SIGKILL and _kill_all(self.path):
            return set(pids)
        reached: set[int] = set()
        for pid in pids:
            try:
                os.kill(pid, sig)
                reached.add(pid)
            except (ProcessLookupError, PermissionError):
                continue
        return reached

    def remove(self) -> bool:
        """Remove it when empty; False while something is still in it (stuck in the kernel)."""
        try:
            self.path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            return False


def _kill_all(path: Path) -> bool:
    """``cgroup.kill``: SIGKILL to every process in the cgroup at once, none can fork away."""
    try:
        (path / "cgroup.kill").write_text("1")
        return True
    except OSError:
        return False


def sweep(parent: Path, prefix: str) -> None:
    """Stop and remove the job cgroups ``prefix*`` a previous daemon life left under ``parent``."""
    try:
        stale = [p for p in parent.iterdir() if p.name.startswith(prefix) and p.is_dir()]
    except OSError:
        return
    for p in stale:
        pids = stop_and_remove(JobCgroup(p))
        if pids:
            log.warning("cgroup_leftovers_stopped", cgroup=str(p), pids=pids,
                        message=f"{len(pids)} process(es) of an earlier attempt were still in {p}; "
                                "killed before the next attempt starts")


def stop_and_remove(cg: JobCgroup) -> list[int]:
    """SIGKILL what is left in ``cg``, wait for it to leave (bounded), remove the cgroup; the pids
    that were in it. Still not empty (stuck in the kernel): the next sweep tries again."""
    pids = cg.pids()
    if pids:
        cg.signal(signal.SIGKILL)
        deadline = time.monotonic() + SWEEP_WAIT_S
        while cg.populated() and time.monotonic() < deadline:
            time.sleep(0.01)  # SIGKILLed processes leave in milliseconds; rare (a crashed daemon)
    cg.remove()
    return pids


def sweep_empty(parent: Path, older_than_s: float = 60.0, now: float | None = None) -> int:
    """Remove the empty job cgroups (any run's) that daemons killed outright left under ``parent``;
    the number removed. Only empty ones (rmdir refuses any other) and only old ones: a live
    daemon's cgroup is empty just between its mkdir and its job's start."""
    removed, now = 0, time.time() if now is None else now
    try:
        old = [p for p in parent.iterdir() if p.name.startswith("tsup-") and p.is_dir()
               and now - p.stat().st_mtime > older_than_s]
    except OSError:
        return 0
    for p in old:
        cg = JobCgroup(p)
        if not cg.populated() and cg.remove():
            removed += 1
    return removed


VERIFIER_PREFIX = "tsup-verify-"
#: what the verifier's cgroup is given, where the file exists (the controller is delegated to us):
#: the idle scheduling class for the group (Linux 5.15+), else the lowest CPU weight; the lowest
#: IO weight (1 against the default 100).
VERIFIER_WEIGHTS = (("cpu.idle", "1"), ("cpu.weight", "1"), ("io.weight", "default 1"))


def set_weights(path: Path) -> dict[str, str]:
    """Write :data:`VERIFIER_WEIGHTS` into the cgroup ``path``; the ones that took."""
    done: dict[str, str] = {}
    for name, value in VERIFIER_WEIGHTS:
        f = path / name
        if not f.exists():
            continue  # that controller is not enabled for our children
        try:
            f.write_text(value)
            done[name] = value
        except OSError:
            continue
    return done


class VerifierCgroup:
    """The load tests' cgroup beside the job's, made on first use (once per daemon life). A
    process started for a test is moved into it (:meth:`enter`: a weight, not containment, so the
    first milliseconds outside it do not matter). Where no cgroup v2 is ours, it is not made and
    the load tests' own priorities (nice 10, the session's autogroup nice, the idle IO class) are
    what yields to the job."""

    def __init__(self, find_parent: Callable[[], tuple[Path | None, str]] = own_cgroup) -> None:
        self._find_parent = find_parent
        self._lock = threading.Lock()
        self._tried = False
        self.path: Path | None = None
        self.weights: dict[str, str] = {}

    def enter(self, pid: int) -> bool:
        """Move ``pid`` into the verifier's cgroup; False where there is none or it failed."""
        for _ in range(2):
            path = self._ensure()
            if path is None:
                return False
            try:
                (path / "cgroup.procs").write_text(str(pid))
                return True
            except FileNotFoundError:
                # Removed under us (another daemon's sweep of empty tsup- cgroups): made again once.
                with self._lock:
                    self.path, self._tried = None, False
            except OSError:
                return False  # it exited already, or the move is refused: its priorities still hold
        return False

    def remove(self) -> None:
        """Remove it once its processes are gone (the daemon exits); a leftover still in use is
        removed by a later daemon's sweep of empty ``tsup-`` cgroups."""
        with self._lock:
            if self.path is not None:
                JobCgroup(self.path).remove()
            self.path, self._tried = None, False  # a later test (a new checkpoint dir's service) makes it again

    def _ensure(self) -> Path | None:
        with self._lock:
            if self._tried:
                return self.path
            self._tried = True
            parent, why = self._find_parent()
            if parent is None:
                log.info("verifier_cgroup", cgroup=None, reason=why,
                         message=f"no cgroup for the load tests ({why}); they yield to the job by their "
                                 "nice value and the idle IO class")
                return None
            path = parent / f"{VERIFIER_PREFIX}{os.getpid()}"
            try:
                path.mkdir(mode=0o755, exist_ok=True)
            except OSError as e:
                log.info("verifier_cgroup", cgroup=None, reason=str(e),
                         message=f"cannot create the load tests' cgroup under {parent} ({e}); they yield to the "
                                 "job by their nice value and the idle IO class")
                return None
            self.path, self.weights = path, set_weights(path)
            log.info("verifier_cgroup", cgroup=str(path), weights=self.weights,
                     message=(f"load tests run in {path} with {', '.join(f'{k} = {v}' for k, v in self.weights.items())}"
                              if self.weights else
                              f"load tests run in {path}; no cpu or io controller is delegated here, so no "
                              "weight: their nice value and the idle IO class yield to the job"))
            return path
