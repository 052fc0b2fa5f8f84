"""`status` as operators expect (issue 23 build 3), through the real daemon: while a run is
running it exits 0 with one truth per line; after the daemon exited it prints the last run from
the ledger (state, exit code, reason, when, the last lines of the job's log) and exits 3, as
`systemctl status` does for an inactive unit; with no run at all it exits 1."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT
from tests.util import wait_for

PY = sys.executable

# Prints "line i" for i < 30, then exits with the status in argv[1].
LINES_THEN_EXIT = "import sys\nfor i in range(30):\n    print('line', i, flush=True)\nsys.exit(int(sys.argv[1]))\n"

# Prints "alive" and waits until the file named by argv[1] exists.
WAITER = ("import os, sys, time\nprint('alive', flush=True)\n"
          "while not os.path.exists(sys.argv[1]):\n    time.sleep(0.02)\n")


def status(sd: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "supervisor", "status", "--state-dir", str(sd), *flags], cwd=str(ROOT),
                          capture_output=True, text=True, timeout=60)


def test_status_after_a_finished_run_exits_3_with_the_end_and_the_log_tail(daemons, tmp_path: Path) -> None:
    sd = tmp_path / "sd"
    d = daemons(["wrap", "--state-dir", str(sd), "--", PY, "-c", LINES_THEN_EXIT, "0"])
    assert d.wait() == 0
    r = status(sd)
    assert r.returncode == 3, r.stdout + r.stderr
    out = r.stdout
    assert "no daemon is running: the last run" in out
    assert "(exit 0)" in out and " ago, at " in out  # when it ended, said for people
    assert "  resumed from  (nothing: a fresh start)" in out
    tail = [ln.strip() for ln in out.split("lines of the job's log")[1].splitlines()[1:] if ln.startswith("  ")]
    assert tail == [f"line {i}" for i in range(20, 30)]
    j = json.loads(status(sd, "--json").stdout)
    assert j["daemon"] is False and j["exit_code"] == 0 and j["ended_at"]
    assert j["log_tail"] == [f"line {i}" for i in range(20, 30)]


def test_status_after_a_given_up_run_exits_3_and_says_why(daemons, tmp_path: Path) -> None:
    sd = tmp_path / "sd"
    d = daemons(["wrap", "--state-dir", str(sd), "--max-restarts", "0", "--", PY, "-c", LINES_THEN_EXIT, "7"])
    assert d.wait() == 3
    r = status(sd, "--json")
    assert r.returncode == 3, r.stderr
    j = json.loads(r.stdout)
    assert j["state"] == "gave_up" and j["exit_code"] == 3 and j["reason"], j
    r = status(sd)
    assert r.returncode == 3
    assert "  state         gave_up (exit 3)" in r.stdout and f"  reason        {j['reason']}" in r.stdout
    assert "  line 29" in r.stdout


def test_status_of_a_running_run_exits_0_with_one_truth_per_line(daemons, tmp_path: Path) -> None:
    sd, done = tmp_path / "sd", tmp_path / "done"
    d = daemons(["wrap", "--state-dir", str(sd), "--", PY, "-c", WAITER, str(done)])
    try:
        wait_for(lambda: (sd / "job.log").exists() and "alive" in (sd / "job.log").read_text(), timeout=60)
        r = status(sd)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split()[:2] in (["state", "starting"], ["state", "running"]), r.stdout
        labels = [ln.split("  ")[0] for ln in r.stdout.splitlines()]
        assert "resumed from" in labels and "newest good checkpoint" in labels
        assert labels.index("newest good checkpoint") == labels.index("resumed from") + 1
        assert "checkpoint" not in labels  # no bare "checkpoint (none yet)" beside a newest good one
    finally:
        done.touch()
    assert d.wait() == 0
    assert status(sd).returncode == 3


def test_status_without_any_run_exits_1(tmp_path: Path) -> None:
    r = status(tmp_path / "never")
    assert r.returncode == 1 and "no daemon" in r.stderr.lower(), r.stderr
