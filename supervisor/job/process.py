"""The job process: spawn in its own session, its output through the keeper (how it ended: daemon/adapters.py, classify_exit)."""

from __future__ import annotations

import fcntl
import itertools
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

import structlog

# The names stay importable from here (callers predate supervisor.redact, the one place).
from ..redact import SECRET_MARKERS, is_secret, redact_env  # noqa: F401
from .osapi import OsApi, ProcRef
from .cgroup import JobCgroup
from .catchup import OutputLag
from .jobtty import open_pty
from .keeper import stderr_log_path
from .console import Consoles
from .output import KeeperLink, SinkFanout
from .treewalk import TreeWalker, walk

log = structlog.get_logger("supervisor.job.process")


@dataclass(frozen=True)
class LaunchSpec:
    """Exactly what is exec'd: recorded in the ledger before the spawn."""

    argv: tuple[str, ...]
    cwd: str
    env: Mapping[str, str]  # the full environment of the job
    added_env: Mapping[str, str]  # what we added on top of the daemon's (for the ledger)
    cgroup: bool = True  # in a cgroup of its own where one can be made ([job] cgroup)
    prewarm: bool = False  # started in a standby interpreter when one is ready ([job] prewarm)
    tty: tuple[bool, bool] = (False, False)  # stdout, stderr on a pty of their own ([job] tty; jobtty.py)
    log_rotate: tuple[int, int] = (0, 0)  # the keeper rotates job.log at this size, keeping so many (0: never)


# How an attempt's leader is started: (spec, stdout write end, stderr write end, cgroup.procs fd
# or -1) -> the process and how it was started (None: plain; else prewarm's "used" / "cold: why").
Spawn = Callable[[LaunchSpec, int, int, int], "tuple[subprocess.Popen[bytes], object | None]"]


def popen_job(spec: LaunchSpec, out_w: int, err_w: int, procs_fd: int) -> "subprocess.Popen[bytes]":
    """The job exactly as configured: its own session, its output into the keeper's pipes."""
    return subprocess.Popen(
        list(spec.argv), cwd=spec.cwd, env=dict(spec.env), stdin=subprocess.DEVNULL,
        stdout=out_w, stderr=err_w, start_new_session=True, close_fds=True,
        preexec_fn=(lambda: enter_cgroup(procs_fd)) if procs_fd >= 0 else None,
    )


class JobProcess:
    """One running attempt: the leader process, its group, and its output keeper.

    The job's stdout and stderr are pipes held by the output keeper (:mod:`.keeper`), a process
    of its own that appends every byte to job.log (and the stderr bytes to job.stderr.log too)
    and forwards it here: the job survives a ``kill -9`` of the daemon (no EPIPE) and job.log
    keeps every line it printed. ``passthrough`` takes each stream to its own console."""

    def __init__(self, spec: LaunchSpec, fanout: SinkFanout, passthrough: Consoles | None,
                 log_path: Path | None, on_eof: Callable[[str], None], osapi: OsApi,
                 cgroup_parent: Path | None = None, spawn: Spawn | None = None) -> None:
        self.spec = spec
        self.prewarm: object | None = None  # prewarm's Outcome when [job] prewarm is on
        self.osapi = osapi
        log_fd = err_log_fd = -1
        err_log_path = ""
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log_fd = _open_log(str(log_path))
            err_log_path = stderr_log_path(str(log_path))
            try:
                err_log_fd = _open_log(err_log_path)
            except OSError as e:  # job.log has every byte anyway: only `logs --stderr` goes without
                log.warning("job_stderr_log_unavailable", path=err_log_path, error=str(e),
                            message=f"cannot open {err_log_path} ({e}); the job's stderr is still in "
                                    f"{log_path}, but `logs --stderr` cannot show it alone")
                err_log_path = ""
        out_r, out_w = open_pty(1) if spec.tty[0] else _pipe()
        try:
            err_r, err_w = open_pty(2) if spec.tty[1] else _pipe()
        except BaseException:
            os.close(out_r)
            os.close(out_w)
            raise
        # The daemon keeps its own duplicates of the read ends (closed in close()): a keeper
        # killed with -9 then leaves the pipes with a reader, so the job's next print never meets
        # EPIPE, and a new keeper is started on them (respawn_keeper). The other way out, the job
        # writing to job.log directly, would fail the job's own print with ENOSPC on a full disk.
        self._reads = (out_r, err_r)
        self._log_paths = (str(log_path or ""), err_log_path)
        self._respawns = 0
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # The keeper first: from its fork on it holds the read ends, so no write of the job
            # can ever meet a pipe without a reader.
            self.keeper = start_keeper(out_r, err_r, theirs.fileno(), log_fd, str(log_path or ""),
                                       err_log_fd, err_log_path, spec.log_rotate)
        except BaseException:
            for fd in (out_w, err_w, out_r, err_r):
                os.close(fd)
            ours.close()
            raise
        finally:
            for fd in (log_fd, err_log_fd):
                if fd >= 0:
                    os.close(fd)
            theirs.close()
        self.cgroup = _job_cgroup(spec, cgroup_parent) if spec.cgroup and cgroup_parent is not None else None
        procs_fd = self.cgroup.procs_fd() if self.cgroup is not None else -1
        try:
            try:
                if spawn is not None:
                    self.popen, self.prewarm = spawn(spec, out_w, err_w, procs_fd)
                else:
                    self.popen = popen_job(spec, out_w, err_w, procs_fd)
            finally:
                os.close(out_w)  # only the job holds the write ends: the keeper sees EOF when it is gone
                os.close(err_w)
                if procs_fd >= 0:
                    os.close(procs_fd)
        except BaseException:
            ours.close()  # no job: the keeper sees EOF on both pipes and exits
            self._close_reads()
            _reap(self.keeper, 5.0)
            if self.cgroup is not None:
                self.cgroup.remove()
            raise
        self.pid = self.popen.pid
        self.pgid = self.pid  # start_new_session: the leader's pid is the session and group id
        self.leader = osapi.proc_ref(self.pid) or ProcRef(self.pid, 0.0)
        if self.cgroup is not None and self.pid not in self.cgroup.pids() and self.leader.alive():
            log.warning("job_cgroup_not_entered", cgroup=str(self.cgroup.path),
                        message=f"the job could not enter its cgroup {self.cgroup.path}; its processes are "
                                "tracked by session, group and subreaper instead")
            self.cgroup.remove()
            self.cgroup = None
        self.known: dict[int, ProcRef] = {self.pid: self.leader}
        self.link = KeeperLink(ours.detach(), passthrough, fanout, on_eof, self.keeper.pid,
                               respawn=self.respawn_keeper, log_path=str(log_path or ""))
        self.link.start()
        self.status: int | None = None
        self.exited_at: float | None = None
        self._tree_at = float("-inf")
        self._walker = TreeWalker(osapi)

    # -- observation ----------------------------------------------------------------------
    def refresh_tree(self, now: float) -> None:
        """Remember every descendant we can see (with its start time), so that processes that
        leave the group (setsid) are still found and stopped, and a reused pid never is.
        Twice a second: the cgroup's members (one read), or without a cgroup the /proc walk on a
        thread (treewalk.py): it costs a read per host process, and everything the job starts is
        born in its cgroup. A stop walks at once either way (:meth:`_walk_now`)."""
        if now - self._tree_at < 0.5:
            return
        self._tree_at = now
        if self.cgroup is not None:
            self._adopt_cgroup()
            return
        for ref in self._walker.poll(*self._walk_args()):
            self.known.setdefault(ref.pid, ref)

    def _adopt_cgroup(self) -> None:
        """Everyone in the job's cgroup is the job's, whatever session or environment it has."""
        if self.cgroup is None:
            return
        for pid in self.cgroup.pids():
            if pid not in self.known:
                ref = self.osapi.proc_ref(pid)
                if ref is not None:
                    self.known[pid] = ref

    def _walk_args(self) -> tuple[int | None, tuple[tuple[bytes, ...], ...], frozenset[int]]:
        """What a walk needs (treewalk.walk): the leader while it runs, the attempt's markers,
        the pids already known. An attempt run by the prewarm runner has its /proc environ from
        the runner's start (no TSUP_ATTEMPT: the standby was started before it had one), and so has
        what it forks without an exec: those carry the runner's own ``TSUP_STANDBY`` mark."""
        markers = attempt_markers(self.spec.env, getattr(self.prewarm, "mark", ""))
        return (self.pid if self.status is None else None), markers, frozenset(self.known)

    def _walk_now(self) -> None:
        """The walk of :meth:`refresh_tree`, at once: a stop acts on the tree as it is. A
        grandchild that double-forks is re-parented to the daemon (the subreaper) before a walk
        of the leader's tree can see it: the daemon's own children that carry this attempt's
        TSUP_RUN_ID and TSUP_ATTEMPT in their environment are the job's too."""
        for ref in walk(self.osapi, *self._walk_args()):
            self.known.setdefault(ref.pid, ref)

    def pids(self) -> list[int]:
        self._adopt_cgroup()
        return [r.pid for r in self.known.values() if r.alive()]

    def poll(self) -> int | None:
        """Reap the leader if it exited; returns its raw wait status once known."""
        if self.status is None:
            st = self.osapi.reap(self.pid)
            if st is not None:
                self.status = st
                self.exited_at = time.monotonic()  # the keeper's clock: output read before it is the job's last
                self.popen.returncode = os.waitstatus_to_exitcode(st)
        return self.status

    def group_alive(self) -> bool:
        if self.poll() is None:
            return True
        # Fast path: signal 0 to the group. ESRCH means nobody is left (not even a zombie); only
        # when something answers do we pay for the full scan that tells zombies from the living.
        if self.osapi.killpg(self.pgid, 0) and self.osapi.group_members(self.pgid):
            return True
        if self.cgroup is not None and self.cgroup.populated():
            return True
        return any(r.alive() for pid, r in self.known.items() if pid != self.pid)

    def signal_group(self, sig: int) -> None:
        self._adopt_cgroup()  # known, so that they are reaped once dead
        self._walk_now()
        # Each process gets the signal once: the group and the cgroup overlap, and a signal that
        # arrives twice is acted on twice when the first was already handled (two emergency
        # checkpoints for one SIGUSR1 request).
        reached: set[int] = set()
        if self.cgroup is not None:
            reached = self.cgroup.signal(sig)  # SIGKILL: cgroup.kill, nothing in it can fork away
        if self.pid not in reached:
            self.osapi.killpg(self.pgid, sig)
        # Descendants that moved to their own session (or, with a cgroup, out of it) are not
        # reached yet: signal them directly.
        for pid, ref in list(self.known.items()):
            if pid != self.pid and pid not in reached:
                try:
                    if reached or os.getpgid(pid) != self.pgid:
                        self.osapi.kill(ref, sig)
                except (ProcessLookupError, PermissionError):
                    continue
        if sig not in (signal.SIGKILL, signal.SIGCONT):
            # A stopped job (SIGSTOP, ^Z) acts on no signal until continued: without this, a hang
            # that is a SIGSTOPped job waited out the whole grace before its SIGKILL. As systemd does.
            self.signal_group(signal.SIGCONT)

    def reap_orphans(self) -> None:
        """As subreaper we inherit orphaned descendants; reap the ones that were the job's."""
        for pid in list(self.known):
            if pid != self.pid:
                self.osapi.reap(pid)

    def pumps_done(self, timeout: float = 0.0) -> bool:
        """Both output streams ended (every writer gone) and their last lines delivered."""
        if timeout > 0:
            self.link.join(timeout)
        return self.link.ended

    def output_lag(self) -> OutputLag:
        """How far the daemon's handling of the job's output is behind the job (the keeper is not:
        it writes job.log at the job's speed)."""
        return self.link.gauge.lag(self.exited_at)

    def cut_output(self) -> OutputLag:
        """Stop handling the job's output now (a stop's catch-up ran out of its bound); how far
        behind it was when cut (its ``bytes`` stay unparsed, in job.log)."""
        lag = self.output_lag()
        self.link.cut()
        # The lag's bytes are job.log's size past the handled offset: wrong once job.log rotated
        # under a backlog (that offset is in job.log.1): counted over the logs instead.
        return replace(lag, bytes=self.link.gauge.unread(self.link.bytes))

    def respawn_keeper(self) -> tuple[int, int] | None:
        """The keeper died before the job's output ended (killed from outside): a new one on the
        daemon's duplicate read ends, writing the same job.log; (its socket fd, its pid), or None
        after a few (a keeper that cannot live is not restarted forever: its death is said)."""
        if self._respawns >= MAX_KEEPER_RESPAWNS or self._reads[0] < 0:
            return None
        self._respawns += 1
        try:
            self.keeper.wait(1.0)  # reap the dead one
        except subprocess.TimeoutExpired:
            pass
        log_path, err_log_path = self._log_paths
        fds: list[int] = []
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            log_fd = _open_log(log_path) if log_path else -1
            fds.append(log_fd)
            err_fd = _open_log(err_log_path) if err_log_path else -1
            fds.append(err_fd)
            self.keeper = start_keeper(self._reads[0], self._reads[1], theirs.fileno(), log_fd, log_path,
                                       err_fd, err_log_path, self.spec.log_rotate)
        except OSError as e:
            log.error("output_keeper_restart_failed", error=str(e),
                      message=f"cannot start a new output keeper ({e}); the job's pipes stay open (the daemon "
                              "holds them), but what it prints is no longer read")
            ours.close()
            return None
        finally:
            for fd in fds:
                if fd >= 0:
                    os.close(fd)
            theirs.close()
        return ours.detach(), self.keeper.pid

    def _close_reads(self) -> None:
        for fd in self._reads:
            if fd >= 0:
                os.close(fd)
        self._reads = (-1, -1)

    def close(self) -> None:
        self._walker.close()
        self.link.join(2.0)
        if self.link.ended:
            self._close_reads()  # every writer is gone: no keeper will be needed again
        # The keeper exits once every writer of the pipes is gone; a straggler that escaped the
        # stop keeps it (and its job.log copy) going, and the keeper is reaped later.
        _reap(self.keeper, 1.0)
        if self.cgroup is not None and not self.cgroup.populated() and self.cgroup.remove():
            self.cgroup = None


def attempt_markers(env: Mapping[str, str], mark: str = "") -> tuple[tuple[bytes, ...], ...]:
    """The environment entries an orphan of the attempt carries, each set whole (treewalk.orphans):
    its TSUP_RUN_ID with its TSUP_ATTEMPT (never one alone: another attempt, or the next one's
    standby, shares the run id), and the prewarm runner's own ``mark`` where one runs it."""
    full = "TSUP_RUN_ID" in env and "TSUP_ATTEMPT" in env
    ids = (tuple(f"{k}={env[k]}".encode() for k in ("TSUP_RUN_ID", "TSUP_ATTEMPT")),) if full else ()
    return ids + (((mark.encode(),),) if mark else ())


def _job_cgroup(spec: LaunchSpec, parent: Path) -> JobCgroup | None:
    run, attempt = spec.env.get("TSUP_RUN_ID"), spec.env.get("TSUP_ATTEMPT")
    name = f"tsup-{run}-{attempt}" if run and attempt else f"tsup-pid{os.getpid()}-{next(_unnamed)}"
    cg: JobCgroup | None = None
    try:
        cg = JobCgroup.create(parent, name)
        os.close(cg.procs_fd())  # writable for us, or we know now
        return cg
    except OSError as e:
        if cg is not None:
            cg.remove()
        log.warning("job_cgroup_unavailable", parent=str(parent), error=str(e),
                    message=f"cannot create the job's cgroup under {parent} ({e}); its processes are "
                            "tracked by session, group and subreaper instead")
        return None


_unnamed = itertools.count()


def enter_cgroup(procs_fd: int) -> None:
    """Between fork and exec, in the child: into the job's cgroup. Only a write to an fd opened
    before the fork (no allocation, no lock another thread may hold); a failure is seen by the
    parent, which then tracks the job without the cgroup."""
    try:
        os.write(procs_fd, b"0")
    except OSError:
        pass


def _open_log(path: str) -> int:
    """Never through a symlink (one planted at job.log would make the keeper append the job's
    output to any file it can write), and 0600 whatever the umask."""
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)


def start_keeper(out_r: int, err_r: int, sock: int, log_fd: int, log_path: str,
                 err_log_fd: int = -1, err_log_path: str = "",
                 rotate: tuple[int, int] = (0, 0)) -> subprocess.Popen[bytes]:
    """The output keeper process: in a session of its own (no signal meant for the job or a
    terminal's group reaches it), standard library only (``-I -S``: milliseconds to start), with
    none of the job's environment (it is not one of the job's processes). ``rotate``: the size
    at which it rotates the logs and how many rotated ones it keeps (0: it never rotates)."""
    fds = [fd for fd in (out_r, err_r, sock, log_fd, err_log_fd) if fd >= 0]
    return subprocess.Popen(
        [sys.executable, "-I", "-S", str(Path(__file__).with_name("keeper.py")),
         str(out_r), str(err_r), str(sock), str(log_fd), log_path, str(err_log_fd), err_log_path,
         str(rotate[0]), str(rotate[1])],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, pass_fds=fds, start_new_session=True,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )


F_SETPIPE_SZ = 1031
MAX_KEEPER_RESPAWNS = 5  # per attempt


def _pipe() -> tuple[int, int]:
    r, w = os.pipe()
    _widen(w)
    return r, w


def _widen(pipe_fd: int) -> None:
    """1 MiB of pipe (the unprivileged maximum by default) instead of 64 KiB: the job prints on
    while the keeper batches its reads, or while a slow console holds the daemon for a moment."""
    try:
        fcntl.fcntl(pipe_fd, F_SETPIPE_SZ, 1 << 20)
    except OSError:
        pass  # over the system's limit: 64 KiB still works


def _reap(proc: subprocess.Popen[bytes], timeout: float) -> None:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        pass


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
