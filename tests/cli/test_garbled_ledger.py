"""The CLI survives the ledger (issue 34 part 7): a ledger page garbled on disk after a real run
makes `status`, `history` and `logs` print what they can (the job's log is kept apart from the
ledger, at the state dir's known place) and name the problem, never a traceback."""
from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

PY = sys.executable
JOB = "for i in range(40):\n    print('step', i, 'loss', 1.0 / (i + 1), flush=True)\n"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "supervisor", *args], cwd=str(ROOT), capture_output=True, text=True,
                          timeout=60)


def garbled_copy(sd: Path, dest: Path, table: str) -> Path:
    """A copy of the state dir ``sd`` whose ledger has the root page of ``table`` overwritten with junk."""
    shutil.copytree(sd, dest)
    db = sqlite3.connect(dest / "ledger.sqlite")
    try:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # every row in the main file, where the junk goes
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
        root = db.execute("SELECT rootpage FROM sqlite_master WHERE name=?", (table,)).fetchone()[0]
    finally:
        db.close()
    with open(dest / "ledger.sqlite", "r+b") as f:
        f.seek((root - 1) * page_size)
        f.write(b"\xde\xad" * (page_size // 2))
    return dest


@pytest.fixture
def finished_run(daemons, tmp_path: Path) -> Path:
    sd = tmp_path / "sd"
    d = daemons(["wrap", "--state-dir", str(sd), "--", PY, "-c", JOB])
    assert d.wait() == 0, d.stderr()[-2000:]
    return sd


def no_traceback(r: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in r.stderr + r.stdout, r.stderr


def test_a_garbled_runs_page_leaves_status_logs_and_history_saying_so(finished_run: Path, tmp_path: Path) -> None:
    sd = garbled_copy(finished_run, tmp_path / "g-runs", "runs")
    logs = cli("logs", "-n", "3", "--state-dir", str(sd))
    no_traceback(logs)
    assert logs.returncode == 0
    assert logs.stdout.splitlines() == [f"step {i} loss {1.0 / (i + 1)}" for i in (37, 38, 39)]
    assert "cannot be read (database disk image is malformed)" in logs.stderr
    assert f"showing {sd / 'job.log'}" in logs.stderr

    st = cli("status", "--state-dir", str(sd))
    no_traceback(st)
    assert st.returncode == 3  # no daemon, and the state dir holds a run (SPEC)
    assert "the ledger could not be read, so what follows is partial" in st.stdout
    assert "  state         unknown" in st.stdout
    assert "  step 39 loss 0.025" in st.stdout  # the job log's tail, read without the ledger
    j = json.loads(cli("status", "--json", "--state-dir", str(sd)).stdout)
    assert j["state"] == "unknown" and "malformed" in j["ledger_error"] and j["log_tail"][-1] == "step 39 loss 0.025"

    h = cli("history", "--state-dir", str(sd))
    no_traceback(h)
    assert h.returncode == 1
    assert "cannot be read (database disk image is malformed): it is corrupt" in h.stderr
    assert "Move it aside" in h.stderr


def test_a_garbled_events_page_leaves_history_showing_the_attempts(finished_run: Path, tmp_path: Path) -> None:
    sd = garbled_copy(finished_run, tmp_path / "g-events", "events")
    h = cli("history", "--state-dir", str(sd))
    no_traceback(h)
    assert h.returncode == 1  # the history is not whole: said, with the exit
    assert "state finished, exit 0" in h.stdout and "exited 0" in h.stdout  # the attempt row is shown
    assert "history: the run's events could not be read and are left out" in h.stderr
    j = cli("history", "--json", "--state-dir", str(sd))
    no_traceback(j)
    data = json.loads(j.stdout)
    assert data["attempts"][0]["exit_code"] == 0 and data["events"] == []
    assert "malformed" in data["unreadable"]["events"]
    st = cli("status", "--state-dir", str(sd))
    no_traceback(st)
    assert st.returncode == 3 and "  state         finished (exit 0)" in st.stdout
    assert "the ledger could not be read, so what follows is partial" in st.stdout


def test_a_garbled_attempts_page_leaves_history_with_the_run_and_its_events(finished_run: Path,
                                                                            tmp_path: Path) -> None:
    sd = garbled_copy(finished_run, tmp_path / "g-attempts", "attempts")
    r = cli("history", "--json", "--state-dir", str(sd))
    no_traceback(r)
    assert r.returncode == 1
    data = json.loads(r.stdout)
    assert data["state"] == "finished" and data["attempts"] == []
    assert any(e["event"] == "daemon_started" for e in data["events"])
    assert "malformed" in data["unreadable"]["attempts"]


def test_report_on_a_garbled_ledger_names_the_problem_and_exits_non_zero(finished_run: Path, tmp_path: Path) -> None:
    # The runs page garbled: not even the run can be found, so no report; said, exit 1.
    sd = garbled_copy(finished_run, tmp_path / "g-runs", "runs")
    r = cli("report", "--state-dir", str(sd), "--out", str(tmp_path / "out-runs"))
    no_traceback(r)
    assert r.returncode == 1
    assert "cannot be read (database disk image is malformed): it is corrupt" in r.stderr
    assert "no report was written" in r.stderr
    assert not (tmp_path / "out-runs").exists()
    # The metrics page garbled: the report is written from what could be read, and the part left
    # out is named, with exit 1 (the report is not whole).
    sd = garbled_copy(finished_run, tmp_path / "g-metrics", "metrics")
    r = cli("report", "--state-dir", str(sd), "--out", str(tmp_path / "out-metrics"))
    no_traceback(r)
    assert r.returncode == 1
    assert "report: the run's metrics could not be read and are left out of the report" in r.stderr
    assert "malformed" in r.stderr
    assert (tmp_path / "out-metrics" / "report.html").is_file()
    # The events page garbled: the same, for the events.
    sd = garbled_copy(finished_run, tmp_path / "g-events", "events")
    r = cli("report", "--state-dir", str(sd), "--out", str(tmp_path / "out-events"))
    no_traceback(r)
    assert r.returncode == 1 and "the run's events could not be read" in r.stderr
