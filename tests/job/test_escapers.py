"""Every process the job started is stopped (issue 12), both ways, through the real daemon:

- in a cgroup of its own (where cgroup v2 is writable here): even a grandchild that double-forks
  out of the session, ignores SIGTERM *and* scrubs its environment is stopped (cgroup.kill);
- with ``[job] cgroup = false`` (the fallback where no cgroup can be made): the daemon is a
  subreaper, and the re-parented grandchild that keeps the attempt's environment is found by it.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from supervisor.job.cgroup import own_cgroup
from supervisor.job.prewarm import STEADY_S
from tests.conftest import ROOT, Daemon, history, pid_alive, started_daemons
from tests.util import wait_for

PY = sys.executable

# The leader forks a child that leaves the session and forks the grandchild, then exits at once:
# the grandchild is re-parented (to the daemon, the subreaper), ignores SIGTERM and, with
# "scrub", execs sleep with an empty environment (no TSUP_RUN_ID to be recognised by).
ESCAPER = r'''
import os, signal, sys, time
out, scrub = sys.argv[1], sys.argv[2] == "scrub"
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stays ignored across exec
        with open(os.path.join(out, "gpid.tmp"), "w") as f:
            f.write(str(os.getpid()))
        if scrub:
            os.replace(os.path.join(out, "gpid.tmp"), os.path.join(out, "gpid"))
            os.execve("/bin/sleep", ["sleep", "600"], {})
        os.replace(os.path.join(out, "gpid.tmp"), os.path.join(out, "gpid"))
        while True:
            time.sleep(3600)
    os._exit(0)
os.wait()
while True:
    time.sleep(3600)
'''


def run_and_stop(tmp_path: Path, scrub: bool, cgroup: bool, prewarm: bool = False, head: str = "",
                 before: Callable[[Path, Path], None] | None = None) -> tuple[int, str, str]:
    """Start the escaper under a daemon, stop it, return the grandchild's pid, the run id and the
    daemon's stderr. ``head``: the job's code before the escaper's; ``before(state dir, out)``: run
    once the daemon started, before the grandchild is waited for."""
    sd, out = tmp_path / "sd", tmp_path / "out"
    out.mkdir()
    job = tmp_path / "escaper.py"
    job.write_text(head + ESCAPER)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[job]\nname = "escaper"\ncommand = ["{PY}", "{job}", "{out}", "{"scrub" if scrub else "keep"}"]\n'
                   f'cgroup = {"true" if cgroup else "false"}\nprewarm = {"true" if prewarm else "false"}\n[state]\ndir = "{sd}"\n[gpu]\nbackend = "none"\n'
                   '[policy]\nbackoff_initial_s = 0\n[shutdown]\ngrace_s = 1\n')
    own = tmp_path / "daemon"
    own.mkdir()
    gpid = 0
    with started_daemons(lambda: Daemon(["run", "--config", str(cfg)], own)) as start:
        d = start()
        try:
            if before is not None:
                before(sd, out)
            wait_for(lambda: (out / "gpid").exists(), 30, what="the grandchild ready")
            gpid = int((out / "gpid").read_text())
            cp = subprocess.run([PY, "-m", "supervisor", "stop", "--state-dir", str(sd)], cwd=str(ROOT),
                                capture_output=True, text=True, timeout=60)
            assert cp.returncode == 0, cp.stderr
            assert d.wait(60) == 0, d.stderr()[-3000:]
            wait_for(lambda: not pid_alive(gpid), 10, what="the grandchild gone")
        finally:
            if gpid and pid_alive(gpid):
                os.kill(gpid, signal.SIGKILL)
    return gpid, history(sd)["run_id"], d.stderr()


def test_a_scrubbed_double_forked_grandchild_is_stopped_through_the_jobs_cgroup(tmp_path):
    parent, why = own_cgroup()
    if parent is None:
        pytest.skip(f"cgroup v2 is not writable here: {why}")
    _gpid, run_id, err = run_and_stop(tmp_path, scrub=True, cgroup=True)
    assert "event=job_isolation" in err and f"cgroup={parent}" in err
    assert not list(parent.glob(f"tsup-{run_id}-*")), "the attempt's cgroup is removed once empty"


def test_without_a_cgroup_the_subreaper_finds_the_double_forked_grandchild(tmp_path):
    _gpid, _run_id, err = run_and_stop(tmp_path, scrub=False, cgroup=False)
    assert "cgroup = false" in err


def test_without_a_cgroup_and_with_prewarm_the_subreaper_finds_the_double_forked_grandchild(tmp_path):
    """Issue 34: with prewarm every attempt of a plain Python job runs in the prewarm runner, the
    first one too (cold, through a fresh runner). What the job forks without an exec has the
    runner's /proc environ (no TSUP_ATTEMPT): it is found by the runner's TSUP_STANDBY mark."""
    _gpid, run_id, err = run_and_stop(tmp_path, scrub=False, cgroup=False, prewarm=True)
    assert "cgroup = false" in err and "event=shutdown_escalated" in err
    assert history(tmp_path / "sd")["attempts"][0]["prewarm"].startswith("cold: "), run_id


# Attempt 0 prints steps (the next attempt's standby starts STEADY_S past the first) until told to
# fail; attempt 1, run in that standby, is the escaper.
STEPS_THEN_FAIL = r'''
import os, sys, time
if os.environ["TSUP_ATTEMPT"] == "0":
    step = 0
    while not os.path.exists(os.path.join(sys.argv[1], "fail")):
        step += 1
        print(f"step {step}: loss {1.0 / step:.4f}", flush=True)
        time.sleep(0.1)
    sys.exit(1)
'''


def test_without_a_cgroup_an_attempt_handed_to_the_standby_has_its_grandchild_found_too(tmp_path):
    """The restart's attempt runs in the standby started for it while attempt 0 ran (``used``):
    its forked grandchild carries that standby's mark, not the first runner's, and is stopped."""
    def standby_ready_then_fail(sd: Path, out: Path) -> None:
        def ready() -> bool:
            cp = subprocess.run([PY, "-m", "supervisor", "status", "--json", "--state-dir", str(sd)],
                                cwd=str(ROOT), capture_output=True, text=True, timeout=60)
            return cp.returncode == 0 and (json.loads(cp.stdout).get("prewarm") or {}).get("state") == "ready"
        wait_for(ready, 60 + STEADY_S, interval=0.3, what="the next attempt's standby ready")
        (out / "fail").touch()

    _gpid, _run_id, err = run_and_stop(tmp_path, scrub=False, cgroup=False, prewarm=True, head=STEPS_THEN_FAIL,
                                       before=standby_ready_then_fail)
    assert "event=shutdown_escalated" in err
    rows = history(tmp_path / "sd")["attempts"]
    assert [r["prewarm"] for r in rows][1:] == ["used"], rows


def test_a_cgroup_that_cannot_be_made_falls_back_and_says_so(tmp_path):
    """A parent that is no cgroup (no cgroup.procs in the new directory): the job runs without
    one, the directory made for it is removed, and the reason is said."""
    from structlog.testing import capture_logs

    from supervisor.job.osapi import OsApi
    from supervisor.job.output import SinkFanout
    from supervisor.job.process import JobProcess, LaunchSpec

    parent = tmp_path / "not-a-cgroup"
    parent.mkdir()
    spec = LaunchSpec((PY, "-c", "print('ran')"), str(tmp_path),
                      {**os.environ, "TSUP_RUN_ID": "r1", "TSUP_ATTEMPT": "0"}, {})
    with capture_logs() as logs:
        job = JobProcess(spec, SinkFanout(), None, tmp_path / "job.log", lambda _s: None, OsApi(), cgroup_parent=parent)
    assert job.cgroup is None and not list(parent.iterdir())
    assert [e["event"] for e in logs] == ["job_cgroup_unavailable"]
    wait_for(lambda: job.poll() is not None, 30, what="the job's exit")
    assert job.pumps_done(10)
    job.close()
    assert (tmp_path / "job.log").read_text() == "ran\n"


def test_what_a_killed_daemon_left_in_the_jobs_cgroup_is_stopped_by_the_next_daemon(tmp_path):
    """kill -9 of the daemon: the next one stops the old job's group as before, and the scrubbed
    grandchild that escaped the group is killed with the old attempt's cgroup before attempt 1."""
    parent, why = own_cgroup()
    if parent is None:
        pytest.skip(f"cgroup v2 is not writable here: {why}")
    sd, out = tmp_path / "sd", tmp_path / "out"
    out.mkdir()
    job = tmp_path / "escaper.py"
    job.write_text("import os, sys\nif os.environ['TSUP_ATTEMPT'] != '0':\n    sys.exit(0)\n" + ESCAPER)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[job]\nname = "escaper"\ncommand = ["{PY}", "{job}", "{out}", "scrub"]\n[state]\ndir = "{sd}"\n'
                   '[gpu]\nbackend = "none"\n[policy]\nbackoff_initial_s = 0\n[shutdown]\nleftover_grace_s = 1\n')
    gpid = 0

    def make(n: int) -> Daemon:
        own = tmp_path / f"daemon{n}"
        own.mkdir()
        return Daemon(["run", "--config", str(cfg)], own)

    with started_daemons(make) as start:
        try:
            d1 = start(0)
            wait_for(lambda: (out / "gpid").exists(), 30, what="the grandchild ready")
            gpid = int((out / "gpid").read_text())
            os.kill(d1.proc.pid, signal.SIGKILL)
            d1.proc.wait(10)
            assert pid_alive(gpid)
            d2 = start(1)
            assert d2.wait(60) == 0, d2.stderr()[-3000:]
            wait_for(lambda: not pid_alive(gpid), 10, what="the escaped grandchild gone")
            assert "cgroup_leftovers_stopped" in d2.stderr()
        finally:
            if gpid and pid_alive(gpid):
                os.kill(gpid, signal.SIGKILL)
    run_id = history(sd)["run_id"]
    wait_for(lambda: not list(parent.glob(f"tsup-{run_id}-*")), 10, what="the run's cgroups removed")


def test_old_empty_job_cgroups_are_swept_and_nothing_else(tmp_path):
    """What daemons killed outright left (empty, old) is removed at the next daemon's start; a
    cgroup with a process in it, or one just made (a live daemon about to start its job), is not."""
    parent, why = own_cgroup()
    if parent is None:
        pytest.skip(f"cgroup v2 is not writable here: {why}")
    import time

    from supervisor.job.cgroup import JobCgroup, sweep_empty

    empty, busy = (JobCgroup(parent / f"tsup-test{os.getpid()}-{n}") for n in ("empty", "busy"))
    for cg in (empty, busy):
        cg.path.mkdir()
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        (busy.path / "cgroup.procs").write_text(str(sleeper.pid))
        sweep_empty(parent)  # both just made: kept
        assert empty.path.exists() and busy.path.exists()
        sweep_empty(parent, now=time.time() + 120)  # two minutes on: the empty one goes
        assert not empty.path.exists() and busy.path.exists()
    finally:
        busy.signal(signal.SIGKILL)
        sleeper.wait(10)
        wait_for(lambda: not busy.populated(), 10, what="the sleeper gone from its cgroup")
        busy.remove()
        empty.remove()
