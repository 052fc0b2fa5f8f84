"""Issue 38 part 1 through the real daemon, at the defaults (no prewarm key anywhere): the next
attempt's standby is started only once the running attempt has shown a training step and run
STEADY_S past it, at idle priority; ``status`` shows its pid, memory and CPU; a SIGKILL of the job
then relaunches it in that standby (history: ``used``)."""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import psutil

from supervisor.job.prewarm import STEADY_S
from tests.conftest import history
from tests.util import wait_for
from tests.watch.test_watch_e2e import _cli

PY = sys.executable

# Each attempt says its pid and waits for "go" before its first step (attempt 0: the test's window
# to see that no standby is started before a step), then prints a step every 0.1 s until "stop".
JOB = """
import os, sys, time
out, attempt = sys.argv[1], os.environ["TSUP_ATTEMPT"]
open(os.path.join(out, f"pid-{attempt}"), "w").write(str(os.getpid()))
while not os.path.exists(os.path.join(out, "go")):
    time.sleep(0.02)
if attempt == "0":
    open(os.path.join(out, "first-step-at"), "w").write(repr(time.clock_gettime(time.CLOCK_BOOTTIME)))
step = 0
while not os.path.exists(os.path.join(out, "stop")):
    step += 1
    print(f"step {step}: loss {1.0 / step:.4f}", flush=True)
    time.sleep(0.1)
"""


def _status(sd: Path) -> dict:
    cp = _cli("status", "--json", "--state-dir", str(sd))
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)


def _ready(sd: Path) -> dict | None:
    block = _status(sd).get("prewarm") or {}
    return block if block.get("state") == "ready" and block.get("rss_bytes") else None


def _autogroup_nice(pid: int) -> int | None:
    """The session's autogroup nice (sched_autogroup shares CPU between sessions first)."""
    try:
        with open(f"/proc/{pid}/autogroup") as f:
            return int(f.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def _may_restore_nice() -> bool:
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NICE)[0]
    return os.geteuid() == 0 or soft == resource.RLIM_INFINITY or soft >= 20


def test_at_the_defaults_the_standby_waits_for_steady_steps_idles_and_serves_a_killed_job(daemons, tmp_path):
    sd, out = tmp_path / "sd", tmp_path / "out"
    out.mkdir()
    (out / "job.py").write_text(JOB)
    d = daemons(["wrap", "--state-dir", str(sd), "--backoff", "0", "--set", f"job.workdir={out}", "--",
                 PY, "job.py", str(out)])
    wait_for(lambda: (out / "pid-0").exists() or d.proc.poll() is not None, 60, what="attempt 0 to start")
    # Launched, no step yet: the standby is due, not started (before issue 38 it was started here).
    before = _status(sd)["prewarm"]
    assert before["state"] == "due" and "first step" in before["reason"], before

    (out / "go").touch()
    block = wait_for(lambda: _ready(sd), 60 + STEADY_S, interval=0.3, what="the standby in status")
    first_step_at = float((out / "first-step-at").read_text())
    sb = psutil.Process(block["pid"])
    assert "standby.py" in " ".join(sb.cmdline()) and sb.cwd() == str(out)
    # Started once the attempt ran STEADY_S past its first step (the job printed it a moment
    # before the daemon parsed it). Both times on the boot clock: /proc's start time is in clock
    # ticks since boot (psutil's create_time adds a boot time rounded to the second).
    with open(f"/proc/{sb.pid}/stat") as f:
        started = int(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
    assert started >= first_step_at + STEADY_S - 0.02, started - first_step_at
    assert block["rss_bytes"] > 1 << 20 and block["cpu_s"] >= 0, block
    wait_for(lambda: sb.ionice().ioclass == psutil.IOPRIO_CLASS_IDLE, 10, what="the idle IO class")
    job_group = _autogroup_nice(int((out / "pid-0").read_text()))
    if job_group is not None:  # its own session's share of the CPU yields to the job's session
        wait_for(lambda: _autogroup_nice(sb.pid) == 19, 10, what="the standby's session at autogroup nice 19")
    if _may_restore_nice():  # only where the standby can give the job its priority back
        wait_for(lambda: os.sched_getscheduler(sb.pid) == os.SCHED_IDLE and sb.nice() == 19, 10,
                 what="SCHED_IDLE at nice 19")

    os.kill(int((out / "pid-0").read_text()), signal.SIGKILL)
    wait_for(lambda: (out / "pid-1").exists() or d.proc.poll() is not None, 60, what="attempt 1 to start")
    assert int((out / "pid-1").read_text()) == sb.pid  # the relaunch ran in the standby
    me = psutil.Process(sb.pid)
    # Handed the job: its priority is the job's own again, every thread of it.
    assert me.ionice().ioclass != psutil.IOPRIO_CLASS_IDLE
    assert os.sched_getscheduler(sb.pid) == os.SCHED_OTHER and me.nice() == psutil.Process().nice()
    assert _autogroup_nice(sb.pid) == job_group  # the session now the job's: the share a cold start's has
    (out / "stop").touch()
    assert d.wait(60) == 0, d.stderr()[-3000:]
    rows = history(sd)["attempts"]
    assert rows[0]["prewarm"].startswith("cold: no standby was ready"), rows[0]
    assert rows[1]["prewarm"] == "used", rows[1]
    assert rows[0]["cause"] == "crash" and rows[1]["exit_code"] == 0, rows
