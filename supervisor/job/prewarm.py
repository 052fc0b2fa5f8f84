"""Pre-warmed restart (``[job] prewarm``): one standby interpreter for the next attempt.

When on and the job is a plain Python job (``python [options] script.py ...`` or ``python
[options] -m module ...``), every attempt runs through the standby runner (:mod:`.standby`), which
records the modules it imports; after an attempt is launched, one standby is started for the next
attempt: the job's own Python with the job's options, environment, working directory, session and
cgroup, importing what the running attempt imports, then waiting. At the next launch it is handed
the attempt's argv, environment, working directory and output pipes and runs the job as
``__main__``; its imports are done. Any doubt and the attempt starts cold, the reason recorded
(:class:`Outcome`): not a plain Python job, no standby yet, the interpreter, options, working
directory or an environment variable other than the per-attempt TSUP_* ones changed, a file the
standby imported or a ``.pth`` file or installed distribution on its path changed since (``code
changed (<module>)``: an upgrade or hot-fix is never run stale), the standby died, refused or did
not answer in time.

When the standby starts, and at what cost. Not at the launch: the attempt's own start-up
(interpreter, imports, data, the first step's compilation) is what the first launch is timed by,
and a standby importing beside it made it slower. It starts once the attempt has shown a training
step (a parsed step or a client heartbeat with one) and run :data:`STEADY_S` past it, at idle
priority while it waits: its session's autogroup nice 19 (CPU is shared between sessions first),
nice 19 and SCHED_IDLE where the standby may undo both before it runs the job (root, or an
RLIMIT_NICE that allows it: standby.py), the lowest CPU weight where it gets a
cgroup of its own (left when it moves into the attempt's), and the idle IO class (set and undone
here, thread by thread). Its memory and CPU are in ``status`` and the metrics (:meth:`Prewarm.status`).

The ledger records the job's exact command either way; the standby is what runs it.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import psutil
import structlog

from .argvarea import padding
from .cgroup import JobCgroup, set_weights, stop_and_remove
from .prewarmplan import STANDBY_MARK, Plan, env_difference, import_env, interpreter_identity, plan
from .process import LaunchSpec, enter_cgroup, popen_job

log = structlog.get_logger("supervisor.job.prewarm")

RUNNER = str(Path(__file__).with_name("standby.py"))
REPLY_TIMEOUT_S = 20.0  # a standby answers between two imports: one big import (torch) may be under way
KEEP_MODULE_LISTS = 3
# How long an attempt runs past its first training step before the next attempt's standby starts.
# A restart in an attempt's first seconds is rare, and a standby started then takes CPU, memory
# bandwidth and ~300 MiB (a torch job) while the job still warms up (allocator, compilation, data
# workers); past it, the attempt is steady and the standby's imports take only idle CPU.
STEADY_S = 5.0


@dataclass(frozen=True)
class Outcome:
    """How an attempt started: ``used`` (in a standby) or ``cold: <why>``."""

    used: bool
    reason: str = ""
    note: str = ""  # used, but its command line is still the standby's: why (argvarea.py)
    mark: str = ""  # the runner's STANDBY_MARK entry: how the attempt's orphans are found (process.py)

    def __str__(self) -> str:
        return "used" if self.used else f"cold: {self.reason}"


def modules_log(state_dir: str, attempt: int) -> str:
    return str(Path(state_dir) / "prewarm" / f"attempt-{attempt}.modules")


class Standby:
    """One standby process: spawned in a session (and, where the job gets one, a cgroup) of its
    own, its output to /dev/null until it runs a job."""

    def __init__(self, plan_: Plan, env: Mapping[str, str], cwd: str, follow: str, *,
                 cgroup: JobCgroup | None = None, procs_fd: int = -1, nice: bool = True) -> None:
        self.plan = plan_
        self.env = import_env(env)
        token = secrets.token_hex(8)
        self.mark = f"{STANDBY_MARK}={token}"  # in its /proc environ, not in self.env (compared)
        self.cwd = cwd
        self.identity = interpreter_identity(plan_.python, env, cwd)
        self.cgroup = cgroup
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock = ours
        conf = json.dumps({"follow": follow, "exclude": plan_.exclude(cwd), "nice": nice})
        cmd = [plan_.python, *plan_.options, RUNNER, str(theirs.fileno()), conf]
        room = padding(plan_.argv(), cmd)  # room in its argv area for the job's command line
        self.note = ""
        own_fd = cgroup.procs_fd() if cgroup is not None else -1
        procs_fd = own_fd if own_fd >= 0 else procs_fd
        try:
            self.popen: subprocess.Popen[bytes] = subprocess.Popen(
                cmd + [room] if room else cmd, cwd=cwd, env={**self.env, STANDBY_MARK: token},
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True, pass_fds=(theirs.fileno(),),
                preexec_fn=(lambda: enter_cgroup(procs_fd)) if procs_fd >= 0 else None)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
            if own_fd >= 0:
                os.close(own_fd)
        self.pid = self.popen.pid
        self._io: tuple[int, int] | None = _idle_io(self.pid) if nice else None
        self._nice = os.getpriority(os.PRIO_PROCESS, 0)  # what a cold start of the job inherits
        self._idle = nice  # at idle priority until lift()

    def lift(self) -> str | None:
        """Before the hand-over, from here: the standby's session, then each thread, back to the
        priority a cold start gets (autogroup nice 0, a new session's; the daemon's nice and IO
        class). An import still under way (the request waits for it) then finishes at the job's
        speed, not as idle CPU on a busy node; the standby restores the same itself after it. Why
        the IO class could not be restored, or None."""
        if not self._idle:
            return None
        try:
            with open(f"/proc/{self.pid}/autogroup", "w") as f:  # raising it back needs no privilege
                f.write("0")
        except OSError:
            pass  # no autogroup here
        try:
            for tid in (int(t) for t in os.listdir(f"/proc/{self.pid}/task")):
                if self._io is not None:
                    psutil.Process(tid).ionice(*self._io)
                try:
                    if os.sched_getscheduler(tid) != os.SCHED_OTHER:
                        os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
                    os.setpriority(os.PRIO_PROCESS, tid, self._nice)
                except PermissionError:
                    pass  # then the standby itself may (RLIMIT_NICE), or refuses: cold
        except (OSError, ValueError, psutil.Error) as e:
            return f"cannot restore the job's priority ({e})"
        self._idle = False
        return None

    def usage(self) -> dict[str, Any]:
        """What the standby holds while it waits: resident memory and CPU seconds (imports)."""
        try:
            p = psutil.Process(self.pid)
            with p.oneshot():
                cpu, rss = p.cpu_times(), p.memory_info().rss
            return {"rss_bytes": rss, "cpu_s": round(cpu.user + cpu.system, 3)}
        except (psutil.Error, OSError):
            return {}

    def doubt(self, p: Plan, env: Mapping[str, str], cwd: str) -> str | None:
        """Why this standby cannot run the attempt; None when it can."""
        if self.popen.poll() is not None:
            return f"the standby exited ({self.popen.returncode}) before it was needed"
        if (p.python, p.options) != (self.plan.python, self.plan.options):
            return "the interpreter or its options changed"
        if cwd != self.cwd:
            return "the working directory changed"
        if (p.kind, p.target) != (self.plan.kind, self.plan.target):
            return "the script or module changed"
        key = env_difference(self.env, env)
        if key is not None:
            return f"environment variable {key} changed"
        if interpreter_identity(p.python, env, cwd) != self.identity or self.identity is None:
            return "the interpreter file changed"
        return None

    def hand_over(self, p: Plan, argv: Sequence[str], env: Mapping[str, str], cwd: str, out_w: int, err_w: int,
                  log_path: str, timeout: float = REPLY_TIMEOUT_S) -> str | None:
        """Send the attempt; None once the standby runs it, else why not (then it is killed)."""
        req = json.dumps({"argv": list(argv), "env": dict(env), "cwd": cwd, "kind": p.kind, "target": p.target,
                          "args": list(p.args), "modules_log": log_path}).encode()
        data = len(req).to_bytes(4, "big") + req
        try:
            self.sock.settimeout(timeout)
            sent = socket.send_fds(self.sock, [data], [out_w, err_w])
            if sent < len(data):
                self.sock.sendall(data[sent:])
            reply = b""
            deadline = time.monotonic() + timeout
            while not reply.endswith(b"\n"):
                self.sock.settimeout(max(0.01, deadline - time.monotonic()))
                more = self.sock.recv(4096)
                if not more:
                    break
                reply += more
        except socket.timeout:
            self.kill()
            return f"the standby did not answer within {timeout:.0f} s"
        except OSError as e:
            self.kill()
            return f"the standby could not be reached ({e})"
        finally:
            self.sock.close()
        text = reply.decode("utf-8", "replace").strip()
        if text == "ok" or text.startswith("ok "):
            self.note = text[3:]  # it runs the job; "ok <why>": under the standby's command line
            return None
        self.kill()
        if text.startswith("refuse "):
            return f"the standby refused: {text[7:]}"
        if text.startswith("stale "):
            return text[6:]  # "code changed (<module>)": what it imported is not what a cold start reads
        return "the standby exited before it answered"

    def enter(self, procs_fd: int) -> bool:
        """Into the attempt's cgroup (its threads with it); the standby's own cgroup goes."""
        try:
            os.write(procs_fd, str(self.pid).encode())
        except OSError:
            return False
        if self.cgroup is not None and self.cgroup.remove():
            self.cgroup = None
        return True

    def kill(self) -> None:
        self.sock.close()
        if self.popen.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)  # its session: whatever an import started with it
            except (ProcessLookupError, PermissionError):
                pass
            if self.cgroup is not None:
                self.cgroup.signal(signal.SIGKILL)
        try:
            self.popen.wait(5.0)
        except subprocess.TimeoutExpired:
            pass
        if self.cgroup is not None and self.cgroup.remove():
            self.cgroup = None


class Prewarm:
    """The one standby (never more), taken by the next launch, replaced after it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._standby: Standby | None = None
        self._closed = False
        # The standby the running attempt is to get, until it has run steadily (see STEADY_S):
        # (its plan, launch spec, cgroup parent), and when its first step was seen.
        self._due: tuple[Plan, LaunchSpec, Path | None] | None = None
        self._first_step_at: float | None = None
        self._starting = False
        self._none_why = "no attempt launched yet"  # why there is no standby and none is due
        self._wake = threading.Event()  # set at close: a standby still waiting to start never does

    def take(self, argv: Sequence[str], env: Mapping[str, str], cwd: str) -> tuple[Plan | None, Standby | None, str]:
        """The plan and the standby for this attempt (or why none: cold). A standby that cannot
        serve it is killed."""
        with self._lock:
            sb, self._standby = self._standby, None
        p = plan(argv)
        if isinstance(p, str):
            if sb is not None:
                sb.kill()
            return None, None, p
        if sb is None:
            return p, None, "no standby was ready (the first attempt, or the previous one was cold)"
        why = sb.doubt(p, env, cwd)
        if why is not None:
            sb.kill()
            return p, None, why
        return p, sb, ""

    def start_next(self, p: Plan, env: Mapping[str, str], cwd: str, follow: str, cgroup_parent: Path | None,
                   name: str) -> None:
        """Start the standby for the next attempt, on a thread (the launch does not wait for it)."""
        threading.Thread(target=self._start, args=(p, env, cwd, follow, cgroup_parent, name),
                         name="prewarm-standby", daemon=True).start()

    def _start(self, p: Plan, env: Mapping[str, str], cwd: str, follow: str, cgroup_parent: Path | None,
               name: str) -> None:
        cg = _standby_cgroup(cgroup_parent, name)
        try:
            sb = Standby(p, env, cwd, follow, cgroup=cg)
        except OSError as e:
            if cg is not None:
                cg.remove()
            with self._lock:
                self._starting, self._none_why = False, f"the standby could not start ({e})"
            log.warning("prewarm_standby_failed", error=str(e),
                        message=f"cannot start the standby interpreter ({e}); the next attempt starts cold")
            return
        with self._lock:
            old, self._standby = self._standby, sb
            closed, self._starting = self._closed, False
        if old is not None:
            old.kill()
        if closed:
            self.close()

    def discard(self) -> None:
        """Kill the standby made for a config that changed (and forget the one due for the running
        attempt: it would be made from that config too); the next launch's comes after its steps."""
        with self._lock:
            sb, self._standby, self._due = self._standby, None, None
            self._none_why = "the job's config changed; the next attempt's standby follows its first step"
        if sb is not None:
            sb.kill()

    def close(self) -> None:
        """Kill the standby for good (the daemon exits)."""
        with self._lock:
            sb, self._standby = self._standby, None
            self._closed, self._due = True, None
        self._wake.set()
        if sb is not None:
            sb.kill()

    def spawn(self, spec: LaunchSpec, out_w: int, err_w: int, procs_fd: int) -> tuple[subprocess.Popen[bytes], Outcome]:
        """Start the attempt: in the standby when it can, else cold (through the runner when the
        job is a plain Python job, so that its imports are recorded for the next standby)."""
        state, attempt = spec.env.get("TSUP_STATE_DIR", ""), spec.env.get("TSUP_ATTEMPT", "")
        log_path = modules_log(state, int(attempt)) if state and attempt.isdigit() else ""
        if log_path:
            Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        p, sb, why = self.take(spec.argv, spec.env, spec.cwd)
        if p is not None and sb is not None:
            if procs_fd >= 0 and not sb.enter(procs_fd):
                sb.kill()
                why = "the standby could not enter the attempt's cgroup"
            elif procs_fd < 0 and sb.cgroup is not None:
                sb.kill()  # its own cgroup has the idle weight: the job never runs there
                why = "the attempt has no cgroup for the standby to move into"
            elif (failed := sb.lift()) is not None:
                sb.kill()
                why = failed
            else:
                failed = sb.hand_over(p, spec.argv, spec.env, spec.cwd, out_w, err_w, log_path)
                if failed is None:
                    return sb.popen, Outcome(True, note=sb.note, mark=sb.mark)
                why = failed
        if p is not None:
            try:
                fresh = Standby(p, spec.env, spec.cwd, "", procs_fd=procs_fd, nice=False)
                failed = fresh.hand_over(p, spec.argv, spec.env, spec.cwd, out_w, err_w, log_path)
                if failed is None:
                    return fresh.popen, Outcome(False, why, mark=fresh.mark)
                why = f"{why}; the runner refused too ({failed})"
            except OSError as e:  # the plain launch below meets the same error, and says it
                why = f"{why}; the runner could not start ({e})"
        return popen_job(spec, out_w, err_w, procs_fd), Outcome(False, why)

    def after_launch(self, spec: LaunchSpec, cgroup_parent: Path | None) -> None:
        """The standby for the attempt after ``spec``'s is due: it starts once this attempt has
        run steadily (:meth:`progressed`), following what ``spec``'s imports."""
        p = plan(spec.argv)
        state, attempt = spec.env.get("TSUP_STATE_DIR", ""), spec.env.get("TSUP_ATTEMPT", "")
        with self._lock:
            self._due, self._first_step_at = None, None
            if isinstance(p, str) or not state or not attempt.isdigit():
                self._none_why = p if isinstance(p, str) else "the attempt has no state dir or number"
                return
            self._due = (p, spec, cgroup_parent)
        prune_module_lists(state, int(attempt))

    def progressed(self, now: float) -> None:
        """The running attempt showed a training step (``now``: monotonic): its standby starts
        :data:`STEADY_S` after the first one (on a thread: a job may print its next step much
        later), unless the next launch came first."""
        with self._lock:
            if self._due is None or self._closed or self._first_step_at is not None:
                return
            self._first_step_at, due = now, self._due
        threading.Thread(target=self._start_when_steady, args=(due,), name="prewarm-standby", daemon=True).start()

    def _start_when_steady(self, due: tuple[Plan, LaunchSpec, Path | None]) -> None:
        self._wake.wait(STEADY_S)
        with self._lock:
            if self._due is not due or self._closed:
                return  # another attempt was launched meanwhile (it has its own), or the daemon exits
            self._due, self._starting = None, True
        p, spec, cgroup_parent = due
        attempt, run = int(spec.env["TSUP_ATTEMPT"]), spec.env.get("TSUP_RUN_ID", "")
        self._start(p, spec.env, spec.cwd, modules_log(spec.env["TSUP_STATE_DIR"], attempt), cgroup_parent,
                    f"tsup-standby-{run or os.getpid()}")

    def status(self) -> dict[str, Any]:
        """``status``'s ``prewarm`` block: where the next attempt's standby is, and what it holds."""
        with self._lock:
            sb, due, first, starting, why = self._standby, self._due, self._first_step_at, self._starting, self._none_why
        if sb is not None:
            alive = sb.popen.poll() is None
            return {"state": "ready" if alive else "exited", "pid": sb.pid, **(sb.usage() if alive else {})}
        if starting:
            return {"state": "starting"}
        if due is not None:
            return {"state": "due", "reason": (f"starts {STEADY_S:g} s after the attempt's first step" if first is None
                                               else f"the attempt's first step was seen; starts {STEADY_S:g} s after it")}
        return {"state": "none", "reason": why}


def _idle_io(pid: int) -> tuple[int, int] | None:
    """The idle IO class for the standby (it reads the job's packages from disk while the job may
    be reading its data); the class and value to restore, or None where it could not be set."""
    try:
        p = psutil.Process(pid)
        was = p.ionice()
        p.ionice(psutil.IOPRIO_CLASS_IDLE)
        return int(was.ioclass), int(was.value or 0)
    except (psutil.Error, OSError, AttributeError):
        return None


def _standby_cgroup(parent: Path | None, name: str) -> JobCgroup | None:
    """A cgroup of its own beside the attempts' (never named like theirs: an attempt's cgroup
    creation sweeps its run's ``tsup-<run>-`` names), with the lowest CPU and IO weight where
    those controllers are ours: idle priority that needs no privilege to undo, since the standby
    leaves this cgroup for the attempt's when it is handed the job."""
    if parent is None:
        return None
    path = parent / name
    try:
        if path.exists():
            stop_and_remove(JobCgroup(path))  # a crashed daemon's standby
        path.mkdir(mode=0o755)
    except OSError:
        return None
    set_weights(path)
    return JobCgroup(path)


def prune_module_lists(state_dir: str, attempt: int) -> None:
    """Only the newest lists stay (a week of restarts leaves a handful of files)."""
    folder = Path(state_dir) / "prewarm"
    try:
        for f in folder.glob("attempt-*.modules"):
            try:
                n = int(f.name[len("attempt-"):-len(".modules")])
            except ValueError:
                continue
            if n <= attempt - KEEP_MODULE_LISTS:
                f.unlink(missing_ok=True)
    except OSError:
        pass
