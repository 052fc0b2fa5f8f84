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

The ledger records the job's exact command either way; the standby is what runs it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import structlog

from .argvarea import padding
from .cgroup import JobCgroup, stop_and_remove
from .process import LaunchSpec, enter_cgroup, popen_job

log = structlog.get_logger("supervisor.job.prewarm")

RUNNER = str(Path(__file__).with_name("standby.py"))
# Set per attempt (launch.launch_spec): they differ between any two attempts, so they are the
# request's to set; a standby is started without them (nothing can depend on them at import, and
# the running attempt's orphan search, which looks for its TSUP_ATTEMPT, never takes the standby).
PER_ATTEMPT = ("TSUP_ATTEMPT", "TSUP_RESUME_FROM", "TSUP_RESUME_STEP", "TSUP_SKIP_BATCHES",
               "TSUP_HEARTBEAT_DIR", "TORCHELASTIC_ERROR_FILE")
# Interpreter options that take no argument and those that take one: the standby starts with the
# same ones. Anything else (-c, -i, combined flags) is a doubt: cold.
FLAGS = frozenset({"-u", "-O", "-OO", "-B", "-s", "-S", "-E", "-I", "-P", "-b", "-bb", "-q", "-d", "-R"})
FLAGS_WITH_VALUE = frozenset({"-X", "-W"})
REPLY_TIMEOUT_S = 20.0  # a standby answers between two imports: one big import (torch) may be under way
KEEP_MODULE_LISTS = 3


@dataclass(frozen=True)
class Plan:
    """A plain Python job: how the standby runs it."""

    python: str  # argv[0], as given
    options: tuple[str, ...]
    kind: str  # "script" | "module"
    target: str  # the script's path (as given) or the module's name
    args: tuple[str, ...]  # after the script or module

    def argv(self) -> list[str]:
        """The command this plan runs (the attempt's, as planned)."""
        main = [self.target] if self.kind == "script" else ["-m", self.target]
        return [self.python, *self.options, *main, *self.args]

    def exclude(self, cwd: str) -> list[str]:
        """The job's own folders: nothing found there is preloaded."""
        dirs = [cwd]
        if self.kind == "script":
            dirs.append(os.path.dirname(os.path.join(cwd, self.target)) or cwd)
        return dirs


@dataclass(frozen=True)
class Outcome:
    """How an attempt started: ``used`` (in a standby) or ``cold: <why>``."""

    used: bool
    reason: str = ""
    note: str = ""  # used, but its command line is still the standby's: why (argvarea.py)

    def __str__(self) -> str:
        return "used" if self.used else f"cold: {self.reason}"


def plan(argv: Sequence[str]) -> Plan | str:
    """The plan for ``argv``, or why it is not a plain Python job (then: cold)."""
    if not argv:
        return "no command"
    base = os.path.basename(argv[0])
    if not base.startswith("python") or not all(c.isalnum() or c in ".-_" for c in base[6:]) or base.endswith("-config"):
        return f"not a plain Python job ({base} is not a Python interpreter)"
    opts: list[str] = []
    i = 1
    while i < len(argv):
        a = argv[i]
        if a in FLAGS:
            opts.append(a)
        elif a in FLAGS_WITH_VALUE and i + 1 < len(argv):
            opts += [a, argv[i + 1]]
            i += 1
        elif a == "-m" and i + 1 < len(argv):
            return Plan(argv[0], tuple(opts), "module", argv[i + 1], tuple(argv[i + 2:]))
        elif a.startswith("-"):
            return f"interpreter option {a} is not supported by prewarm"
        else:
            return Plan(argv[0], tuple(opts), "script", a, tuple(argv[i + 1:]))
        i += 1
    return "no script or module in the command"


def interpreter_identity(python: str, env: Mapping[str, str], cwd: str) -> tuple[str, int, int] | None:
    """Which file runs as ``python`` (the job's PATH, its cwd): a replaced interpreter is a doubt."""
    path = python if "/" in python else shutil.which(python, path=env.get("PATH", os.defpath))
    if not path:
        return None
    try:
        real = os.path.realpath(os.path.join(cwd, path))
        st = os.stat(real)
    except OSError:
        return None
    return real, st.st_ino, st.st_mtime_ns


def import_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment the standby starts with: the attempt's, less its per-attempt keys."""
    return {k: v for k, v in env.items() if k not in PER_ATTEMPT}


def env_difference(standby: Mapping[str, str], attempt: Mapping[str, str]) -> str | None:
    """The first variable (sorted) that differs, besides the per-attempt ones; None when none.
    Any of them could have been read at import time (CUDA_VISIBLE_DEVICES, PYTHONPATH,
    LD_LIBRARY_PATH, a library's own switches): no list of the ones that matter is trusted."""
    now = import_env(attempt)
    for k in sorted(set(standby) | set(now)):
        if standby.get(k) != now.get(k):
            return k
    return None


def modules_log(state_dir: str, attempt: int) -> str:
    return str(Path(state_dir) / "prewarm" / f"attempt-{attempt}.modules")


class Standby:
    """One standby process: spawned in a session (and, where the job gets one, a cgroup) of its
    own, its output to /dev/null until it runs a job."""

    def __init__(self, plan_: Plan, env: Mapping[str, str], cwd: str, follow: str, *,
                 cgroup: JobCgroup | None = None, procs_fd: int = -1, nice: bool = True) -> None:
        self.plan = plan_
        self.env = import_env(env)
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
                cmd + [room] if room else cmd, cwd=cwd, env=self.env,
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
            log.warning("prewarm_standby_failed", error=str(e),
                        message=f"cannot start the standby interpreter ({e}); the next attempt starts cold")
            return
        with self._lock:
            old, self._standby = self._standby, sb
            closed = self._closed
        if old is not None:
            old.kill()
        if closed:
            self.close()

    def discard(self) -> None:
        """Kill the standby made for a config that changed; the next launch starts a new one."""
        with self._lock:
            sb, self._standby = self._standby, None
        if sb is not None:
            sb.kill()

    def close(self) -> None:
        """Kill the standby for good (the daemon exits)."""
        with self._lock:
            sb, self._standby = self._standby, None
            self._closed = True
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
            else:
                failed = sb.hand_over(p, spec.argv, spec.env, spec.cwd, out_w, err_w, log_path)
                if failed is None:
                    return sb.popen, Outcome(True, note=sb.note)
                why = failed
        if p is not None:
            try:
                fresh = Standby(p, spec.env, spec.cwd, "", procs_fd=procs_fd, nice=False)
                failed = fresh.hand_over(p, spec.argv, spec.env, spec.cwd, out_w, err_w, log_path)
                if failed is None:
                    return fresh.popen, Outcome(False, why)
                why = f"{why}; the runner refused too ({failed})"
            except OSError as e:  # the plain launch below meets the same error, and says it
                why = f"{why}; the runner could not start ({e})"
        return popen_job(spec, out_w, err_w, procs_fd), Outcome(False, why)

    def after_launch(self, spec: LaunchSpec, cgroup_parent: Path | None) -> None:
        """The standby for the attempt after ``spec``'s, following what ``spec``'s imports."""
        p = plan(spec.argv)
        state, attempt, run = (spec.env.get(k, "") for k in ("TSUP_STATE_DIR", "TSUP_ATTEMPT", "TSUP_RUN_ID"))
        if isinstance(p, str) or not state or not attempt.isdigit():
            return
        prune_module_lists(state, int(attempt))
        self.start_next(p, spec.env, spec.cwd, modules_log(state, int(attempt)), cgroup_parent,
                        f"tsup-standby-{run or os.getpid()}")


def _standby_cgroup(parent: Path | None, name: str) -> JobCgroup | None:
    """A cgroup of its own beside the attempts' (never named like theirs: an attempt's cgroup
    creation sweeps its run's ``tsup-<run>-`` names)."""
    if parent is None:
        return None
    path = parent / name
    try:
        if path.exists():
            stop_and_remove(JobCgroup(path))  # a crashed daemon's standby
        path.mkdir(mode=0o755)
        return JobCgroup(path)
    except OSError:
        return None


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
