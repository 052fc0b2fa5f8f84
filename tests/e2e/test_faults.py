"""Fault injection through the real daemon (issue 12): one matrix, the same four checks for
every fault.

Each case runs ``python -m supervisor run --config`` (the fake Xid: the same daemon through the
test-only launcher ``tests/helpers/fake_gpu_daemon.py``, which swaps the NVML backend for the
scripted fake behind the real interface) on one small job script that hurts itself once, in its
first attempt, and succeeds in the next. For each case:

1. the cause: the ledger (``history --json``) names the right cause for attempt 0;
2. the decision: and the right action (restart, rollback, warn, a stop, an adopted leftover);
3. no data lost: every attempt and its ``job_started`` event are in the ledger; every line the
   job printed (it keeps its own record, written after each successful print) is in
   ``job.log``; no checkpoint file is gone (a bad one is only moved to ``quarantine/``);
4. no process left behind: once the daemon exited, no process carries the run's
   ``TSUP_RUN_ID`` and no pid the job recorded is alive.

Timeouts are short through the config (the clock cannot be injected across processes); the
test polls with deadlines and never sleeps to wait.
"""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import psutil
import pytest

from tests.conftest import HELPERS, ROOT, Daemon, history, pid_alive, started_daemons
from tests.util import wait_for

pytestmark = pytest.mark.slow

PY = sys.executable

# The job: attempt n prints steps 1000n+1..1000n+5 (JSON metric lines), then, in attempt 0 only,
# the fault named by argv[1]. Later attempts exit 0. Every line is recorded in printed<n> after
# the print succeeded; every process it starts writes its pid to a file.
JOB = r'''
import json, os, signal, sys, time
mode, out, ck = sys.argv[1], sys.argv[2], sys.argv[3]
n = sum(1 for p in os.listdir(out) if p.startswith("attempt"))
def put(name, text):
    with open(os.path.join(out, name + ".tmp"), "w") as f:
        f.write(text)
    os.replace(os.path.join(out, name + ".tmp"), os.path.join(out, name))
put(f"attempt{n}", str(os.getpid()))
record = open(os.path.join(out, f"printed{n}"), "a")
def say(line):
    print(line, flush=True)
    record.write(line + "\n")
    record.flush()
def step(i, loss=2.0):
    say(json.dumps({"step": 1000 * n + i, "loss": loss}))
def wait_file(name):
    while not os.path.exists(os.path.join(out, name)):
        time.sleep(0.02)
def forever():
    while True:
        time.sleep(3600)
resume = os.environ.get("TSUP_RESUME_FROM")
if resume:
    import zipfile
    if not zipfile.is_zipfile(resume):  # what torch.load says of a torch file cut short
        say("RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory")
        sys.exit(1)
for i in range(1, 6):
    step(i)
if n > 0:
    sys.exit(0)
if mode == "crash":
    say("RuntimeError: injected crash")
    sys.exit(1)
elif mode == "sigkill":
    os.kill(os.getpid(), signal.SIGKILL)
elif mode == "sigsegv":
    os.kill(os.getpid(), signal.SIGSEGV)
elif mode == "sigstop":
    os.kill(os.getpid(), signal.SIGSTOP)
    forever()
elif mode == "nan":
    step(6, float("nan"))
    forever()
elif mode == "oom":
    say("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
        "capacity of 79.15 GiB of which 1.06 GiB is free.")
    sys.exit(1)
elif mode == "nccl":
    say("[rank0]:[E ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600081 "
        "milliseconds before timing out.")
    forever()
elif mode == "xid":
    put("ready", "")
    forever()
elif mode.startswith("corrupt_ckpt"):
    dest = os.path.join(ck, "step_000200.pt")
    os.replace(os.path.join(out, "corrupt.pt"), dest)  # the newest checkpoint, written whole but bad
    old = time.time() - 60
    os.utime(dest, (old, old))
    say("RuntimeError: injected crash after a bad save")
    sys.exit(1)
elif mode == "disk_full":
    put("ready", "")
    wait_file("go")
    step(6)
    sys.exit(0)
elif mode == "rotation":
    log = os.path.join(out, "train.log")
    f = open(log, "a")
    for i in range(11, 16):
        f.write(json.dumps({"step": i, "loss": 2.0}) + "\n")
        f.flush()
    put("ready", "")
    wait_file("rotate")
    os.rename(log, log + ".1")  # logrotate's create mode: rename, then a new file
    f.close()
    f = open(log, "a")
    for i in range(16, 19):
        f.write(json.dumps({"step": i, "loss": 2.0}) + "\n")
    f.write(json.dumps({"step": 19, "loss": float("nan")}) + "\n")
    f.flush()
    forever()
elif mode == "daemon_kill9_quiet":  # the daemon dies while the job prints nothing
    put("ready", "")
    wait_file("finish")
    sys.exit(0)
elif mode == "daemon_kill9":  # the daemon dies while the job prints
    put("ready", "")
    i = 6
    while not os.path.exists(os.path.join(out, "finish")):
        step(i)
        i += 1
        time.sleep(0.01)
    sys.exit(0)
elif mode == "grandchild":
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:  # out of the group and the session, deaf to SIGTERM
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            put("grandchild", str(os.getpid()))
            forever()
        os._exit(0)  # its parent leaves at once: the grandchild is re-parented to the daemon
    os.wait()
    forever()
'''


@dataclass
class Run:
    """One case's files and daemon(s)."""

    tmp: Path
    sd: Path
    out: Path
    ck: Path
    cfg: Path
    start: Callable[..., Daemon]
    daemons: list[Daemon] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)  # what a case's drive saw, for its check

    def daemon(self) -> Daemon:
        d = self.start(len(self.daemons))
        self.daemons.append(d)
        return d

    def recorded_pids(self) -> list[int]:
        names = [p for p in self.out.iterdir() if p.name.startswith("attempt") or p.name == "grandchild"]
        return [int(p.read_text()) for p in names if not p.name.endswith(".tmp")]

    def printed(self) -> list[str]:
        lines: list[str] = []
        for p in sorted(self.out.glob("printed*")):
            lines += p.read_text().splitlines()
        return lines


@dataclass(frozen=True)
class Case:
    id: str
    cause: str | None  # attempt 0's cause in the ledger
    action: str | None  # attempt 0's action in the ledger
    attempts: int | tuple[int, ...] = 2  # how many attempts the ledger holds (a tuple: any of them)
    exit_code: int = 0
    config: str = ""
    fake_gpu: list[Any] | None = None  # a timeline for the fake NVML backend
    needs_root: bool = False
    drive: Callable[[Run], None] | None = None  # between the start and the daemon's exit
    check: Callable[[Run, dict[str, Any]], None] | None = None
    marks: tuple[Any, ...] = ()


# -- what some cases do while the daemon runs, and check after ----------------------------------

def _check_hang(run: Run, h: dict[str, Any]) -> None:
    det = h["attempts"][0]["detection"]
    assert det and det["cause"] == "hang", det


def _check_signal(name: str) -> Callable[[Run, dict[str, Any]], None]:
    def check(run: Run, h: dict[str, Any]) -> None:
        assert h["attempts"][0]["signal"] == name and h["attempts"][0]["exit_code"] is None

    return check


def _check_exit_1(run: Run, h: dict[str, Any]) -> None:
    a0 = h["attempts"][0]
    assert a0["exit_code"] == 1, {k: a0[k] for k in ("exit_code", "signal", "summary", "shutdown", "detection")}


def _check_oom(run: Run, h: dict[str, Any]) -> None:
    """The job exits 1 right after the OOM line; the daemon, acting on the line, may stop it first
    (SIGTERM, the stop recorded). Either way the line is the cause, not a plain crash."""
    a0 = h["attempts"][0]
    assert a0["exit_code"] == 1 or (a0["signal"] == "SIGTERM" and a0["shutdown"]), a0
    assert "out of memory" in a0["detection"]["evidence"], a0["detection"]


def _check_corrupt(run: Run, h: dict[str, Any]) -> None:
    """The last attempt resumed from the good step 100. With checkpoints.verify = "overlap" (the
    default) an attempt may first launch from the bad step 200 on its structural checks alone:
    it fails as checkpoint_load_error (the job's load error or the overlapped load test) and the
    next one resumes from step 100 at once."""
    *middle, last = h["attempts"][1:]
    assert last["checkpoint"] and last["checkpoint"].endswith("step_000100.pt"), last["checkpoint"]
    for a in middle:
        assert a["checkpoint"].endswith("step_000200.pt") and a["cause"] == "checkpoint_load_error", a
        assert a["action"] == "restart"
    assert (run.ck / "quarantine" / "step_000200.pt").exists(), sorted(str(p) for p in run.ck.rglob("*"))
    assert not (run.ck / "step_000200.pt").exists()
    assert (run.ck / "step_000100.pt").exists()


def _tiny_tmpfs(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=755", "tmpfs", str(path)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root to mount a tiny tmpfs (a full disk)")


def _fill(path: Path) -> None:
    try:
        with open(path / "filler", "ab") as f:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
    except OSError:
        pass


def _drive_disk_full(run: Run) -> None:
    d = run.daemon()
    wait_for(lambda: (run.out / "ready").exists(), 30, what="job ready")
    _fill(run.ck)
    wait_for(lambda: "disk_low" in d.stderr(), 20, what="disk_low said")
    (run.out / "go").write_text("")
    assert d.wait(30) == 0
    (run.ck / "filler").unlink()  # the test's own filler, not a checkpoint


def _check_disk_full(run: Run, h: dict[str, Any]) -> None:
    warned = [e for e in h["events"] if e["event"] == "detection_warned"]
    assert warned and warned[0]["data"]["cause"] == "disk_low", [e["event"] for e in h["events"]]
    assert h["attempts"][0]["cause"] is None and h["attempts"][0]["exit_code"] == 0


def _metric_steps(run: Run, attempt: int) -> set[int]:
    db = sqlite3.connect(run.sd / "ledger.sqlite")
    try:
        return {s for (s,) in db.execute("SELECT step FROM metrics WHERE attempt = ?", (attempt,))}
    except sqlite3.OperationalError:
        return set()
    finally:
        db.close()


def _events(run: Run, name: str) -> list[int | None]:
    """The attempts of the ledger's ``name`` events so far (none while the ledger is not made:
    read-only, so that the test never makes it)."""
    db = sqlite3.connect(f"file:{run.sd / 'ledger.sqlite'}?mode=ro", uri=True)
    try:
        return [a for (a,) in db.execute("SELECT attempt FROM events WHERE event = ?", (name,))]
    except sqlite3.OperationalError:
        return []
    finally:
        db.close()


def _drive_rotation(run: Run) -> None:
    d = run.daemon()
    wait_for(lambda: (run.out / "ready").exists(), 30, what="job ready")
    wait_for(lambda: 15 in _metric_steps(run, 0), 20, what="the tailed lines before the rotation in the ledger")
    (run.out / "rotate").write_text("")
    assert d.wait(60) == 0


def _check_rotation(run: Run, h: dict[str, Any]) -> None:
    # Every line of train.log, before and after the rename, reached the detectors and the ledger.
    assert set(range(11, 19)) <= _metric_steps(run, 0), sorted(_metric_steps(run, 0))
    assert h["attempts"][0]["detection"]["step"] == 19


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _daemon_kill9(printing: bool) -> Callable[[Run], None]:
    """Kill -9 the daemon while the job prints (or while it is quiet); a second daemon on the
    same config and state dir adopts or stops the job and carries on."""
    return lambda run: _drive_daemon_kill9(run, printing)


def _drive_daemon_kill9(run: Run, printing: bool) -> None:
    d1 = run.daemon()
    wait_for(lambda: (run.out / "ready").exists(), 30, what="job ready")
    # The job can be ready before its daemon, descheduled on a loaded machine, has recorded the
    # start it made (the pid is known only after the spawn): the kill is meant for a daemon that
    # supervises a running job, so it waits for that row (a kill between the two is another case).
    wait_for(lambda: _events(run, "job_started"), 30, what="the first daemon's job_started in the ledger")
    job = int((run.out / "attempt0").read_text())
    os.kill(d1.proc.pid, signal.SIGKILL)  # only the daemon: the job runs in a session of its own
    d1.proc.wait(10)
    printed = run.out / "printed0"
    seen = _lines(printed)
    if printing:
        # The job keeps printing (every 10 ms) with no daemon: its output must not break it.
        # Said last (in the check), so that the adoption and the ledger are checked either way.
        wait_for(lambda: _lines(printed) >= seen + 50 or not pid_alive(job), 10, what="the job printing on")
        run.notes["job_survived_its_daemon"] = pid_alive(job) and _lines(printed) >= seen + 50
    else:
        run.notes["job_survived_its_daemon"] = pid_alive(job)
    d2 = run.daemon()
    wait_for(lambda: "daemon_started" in d2.stderr(), 30, what="the second daemon up")
    (run.out / "finish").write_text("")  # an adopted job may finish now
    assert d2.wait(60) == 0


def _check_daemon_kill9(run: Run, h: dict[str, Any]) -> None:
    a0 = h["attempts"][0]
    assert a0["counted"] is False and "daemon was restarted" in a0["summary"], a0["summary"]
    assert run.notes["job_survived_its_daemon"], "the job died when its daemon was killed (EPIPE)"


def _drive_grandchild(run: Run) -> None:
    d = run.daemon()
    wait_for(lambda: (run.out / "grandchild").exists(), 30, what="grandchild ready")
    cp = subprocess.run([PY, "-m", "supervisor", "stop", "--state-dir", str(run.sd)], cwd=str(ROOT),
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert d.wait(60) == 0


def _check_stopped(run: Run, h: dict[str, Any]) -> None:
    assert h["state"] == "stopped", h["state"]


CASES = [
    Case("crash", "crash", "restart", check=_check_exit_1),
    Case("sigkill", "crash", "restart", check=_check_signal("SIGKILL")),
    Case("sigsegv", "crash", "restart", check=_check_signal("SIGSEGV")),
    Case("sigstop", "hang", "restart", config="[heartbeat]\noutput_stall_timeout_s = 2\n", check=_check_hang),
    Case("nan", "nan", "rollback"),
    Case("oom", "oom", "restart", check=_check_oom),
    Case("nccl", "nccl_timeout", "restart"),
    Case("xid", "gpu_fault", "restart", config="[gpu]\npoll_s = 0.2\n",
         fake_gpu=[[1.0, {"xid": {"device": 0, "code": 13}}]]),
    Case("corrupt_ckpt", "crash", "restart", attempts=(2, 3), check=_check_corrupt,
         config="[checkpoints]\nsettle_s = 0.5\n[validation]\nenabled = false\n"),
    Case("corrupt_ckpt_verify_before_launch", "crash", "restart", check=_check_corrupt,
         config="[checkpoints]\nsettle_s = 0.5\nverify = \"before-launch\"\n[validation]\nenabled = false\n"),
    Case("disk_full", None, None, attempts=1, needs_root=True, drive=_drive_disk_full, check=_check_disk_full,
         config="[host]\npoll_s = 0.2\ndisk_min_free_gb = 0.004\ndisk_ckpt_multiple = 0\n"),
    Case("rotation", "nan", "rollback", drive=_drive_rotation, check=_check_rotation,
         config='[job]\nwatch_files = ["train.log"]\n'),
    Case("daemon_kill9_quiet", None, None, drive=_daemon_kill9(printing=False), check=_check_daemon_kill9),
    Case("daemon_kill9", None, None, drive=_daemon_kill9(printing=True), check=_check_daemon_kill9),
    Case("grandchild", None, None, attempts=1, drive=_drive_grandchild, check=_check_stopped),
]


def _config(case: Case, run: Run, job: Path) -> str:
    argv = [PY, str(job), case.id, str(run.out), str(run.ck)]
    job_table = f"[job]\nname = \"fault-{case.id}\"\ncommand = {json.dumps(argv)}\nworkdir = \"{run.out}\"\n"
    gpu = "" if case.fake_gpu is not None else "[gpu]\nbackend = \"none\"\n"
    return _merge_tables(job_table + f"[state]\ndir = \"{run.sd}\"\n"
                         "[policy]\nbackoff_initial_s = 0\nmax_restarts = 3\n"
                         "[shutdown]\ngrace_s = 2\nhang_grace_s = 1\nleftover_grace_s = 1\n"
                         "[heartbeat]\ndump_stacks = false\n"
                         f"[checkpoints]\ndir = \"{run.ck}\"\n" + gpu + case.config)


def _merge_tables(toml: str) -> str:
    """Repeated table headers (from the shared part and a case's part) merged into one."""
    tables: dict[str, list[str]] = {}
    current = ""
    for line in toml.splitlines():
        if line.startswith("["):
            current = line
            tables.setdefault(current, [])
        elif line.strip():
            tables[current].append(line)
    return "".join(f"{t}\n" + "".join(f"{l}\n" for l in body) for t, body in tables.items())


def _leftovers(run_id: str, pids: list[int]) -> list[str]:
    """Processes alive (not zombies) that carry the run's id or that the job recorded."""
    left = [f"pid {p} (recorded by the job)" for p in pids if pid_alive(p)]
    for proc in psutil.process_iter(["pid", "name"]):
        try:
            if proc.environ().get("TSUP_RUN_ID") == run_id and proc.status() != psutil.STATUS_ZOMBIE:
                left.append(f"pid {proc.pid} {proc.info['name']} (TSUP_RUN_ID={run_id})")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return left


def _kill_recorded(run: Run) -> None:
    for pid in run.recorded_pids():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _ckpt_files(ck: Path) -> set[str]:
    return {p.name for p in ck.rglob("*") if p.is_file()}


class FakeGpuDaemon(Daemon):
    """The real daemon with the scripted fake GPU injected by the test-only launcher."""

    def __init__(self, timeline: Path, args: list[str], tmp: Path) -> None:  # no super().__init__(): it would launch
        self.tmp = tmp
        self.stdout_path = tmp / "daemon.stdout"
        self.stderr_path = tmp / "daemon.stderr"
        e = {**os.environ, "PYTHONUNBUFFERED": "1"}
        e.pop("JOURNAL_STREAM", None)
        e.pop("NOTIFY_SOCKET", None)
        self.proc = subprocess.Popen([PY, str(HELPERS / "fake_gpu_daemon.py"), str(timeline), "--log-format",
                                      "logfmt", *args], cwd=str(ROOT), env=e, stdout=open(self.stdout_path, "wb"),
                                     stderr=open(self.stderr_path, "wb"), start_new_session=True)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=c.marks) for c in CASES])
def test_fault(case: Case, tmp_path: Path) -> None:
    sd, out, ck = tmp_path / "sd", tmp_path / "out", tmp_path / "ck"
    out.mkdir()
    if case.needs_root:
        _tiny_tmpfs(ck)
    else:
        ck.mkdir()
    job = tmp_path / "fault_job.py"
    job.write_text(JOB)
    cfg = tmp_path / "c.toml"

    def factory(n: int) -> Daemon:
        """The n-th daemon of this case, with a folder of its own for its stdout and stderr."""
        args, own = ["run", "--config", str(cfg)], tmp_path / f"daemon{n}"
        own.mkdir()
        if case.fake_gpu is not None:
            timeline = tmp_path / "gpu.json"
            timeline.write_text(json.dumps({"devices": 1, "total_gb": 80, "timeline": case.fake_gpu}))
            return FakeGpuDaemon(timeline, args, own)
        return Daemon(args, own)

    with started_daemons(factory) as start:
        run = Run(tmp_path, sd, out, ck, cfg, start)
        cfg.write_text(_config(case, run, job))
        if case.id.startswith("corrupt_ckpt"):
            _make_checkpoints(ck, out)
        before = _ckpt_files(ck)
        try:
            if case.drive is not None:
                case.drive(run)
            else:
                d = run.daemon()
                code = d.wait(90)
                assert code == case.exit_code, (code, _why(sd), d.events()[-15:])
            h = history(sd)
            _check_all(case, run, h, before)
        finally:
            for d in run.daemons:
                if d.proc.poll() is None:
                    d.kill()
            _kill_recorded(run)
            if case.needs_root:
                subprocess.run(["umount", "-l", str(ck)], capture_output=True)


def _why(sd: Path) -> str:
    """The run's end as the ledger says it (for a failure message)."""
    try:
        h = history(sd)
    except AssertionError as e:
        return f"no history: {e}"
    return f"{h.get('state')}: {h.get('reason')}; attempts {[(a['cause'], a['action']) for a in h['attempts']]}"


def _check_all(case: Case, run: Run, h: dict[str, Any], before: set[str]) -> None:
    stderr = "\n".join(d.stderr()[-2000:] for d in run.daemons)
    attempts = h["attempts"]
    # 1-2. cause and decision
    allowed = case.attempts if isinstance(case.attempts, tuple) else (case.attempts,)
    assert len(attempts) in allowed, ([(a["cause"], a["action"], a["summary"]) for a in attempts], stderr)
    assert (attempts[0]["cause"], attempts[0]["action"]) == (case.cause, case.action), (attempts[0], stderr)
    assert attempts[-1]["exit_code"] == 0 or case.id == "grandchild", attempts[-1]
    # 3. no data lost: attempts, their events, every printed line, every checkpoint file
    assert [a["attempt"] for a in attempts] == list(range(len(attempts)))
    started = [e["attempt"] for e in h["events"] if e["event"] == "job_started"]
    assert started == list(range(len(attempts))), started
    log = (run.sd / "job.log").read_bytes().decode(errors="replace").splitlines()
    missing = [line for line in run.printed() if line not in set(log)]
    assert not missing, f"{len(missing)} printed lines missing from job.log, e.g. {missing[:3]}"
    after = _ckpt_files(run.ck)
    assert before <= after, f"checkpoint files gone: {sorted(before - after)}"
    # 4. no process left behind
    for d in run.daemons:
        assert d.proc.poll() is not None
    left = _leftovers(h["run_id"], run.recorded_pids())
    assert not left, left
    if case.check is not None:  # what only this case promises
        case.check(run, h)


def _make_checkpoints(ck: Path, out: Path) -> None:
    """A good step 100 (with the client's manifest) in the checkpoint dir, and a corrupt step 200
    (the same bytes, cut in half) that the job moves in as its newest save."""
    import torch

    from supervisor.client import save_checkpoint

    good = ck / "step_000100.pt"
    save_checkpoint({"model": {"w": torch.zeros(4)}}, good, step=100)
    old = good.stat().st_mtime - 60
    for p in ck.iterdir():
        os.utime(p, (old, old))
    data = good.read_bytes()
    (out / "corrupt.pt").write_bytes(data[: len(data) // 2])

