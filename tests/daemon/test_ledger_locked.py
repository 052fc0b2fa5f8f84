"""`stop` under a ledger locked by another process (issue 34 part 7), through the real daemon and
the real CLI: an sqlite3 client holding `BEGIN EXCLUSIVE` made each ledger write of the main loop
wait 10 s, so `stop` took 20 s and more. The job is now stopped at once whatever the ledger does,
and the writes that met the lock go in once it is released, at the times they were made."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from supervisor.ops.controlclient import request
from tests.conftest import ROOT, history, pid_alive
from tests.util import wait_for

PY = sys.executable
WAITER = "import time\nprint('alive', flush=True)\nwhile True:\n    time.sleep(0.05)\n"
# Another process: holds the ledger's write lock until its stdin closes.
LOCKER = ("import sqlite3, sys\nc = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
          "c.execute('BEGIN EXCLUSIVE')\nprint('locked', flush=True)\nsys.stdin.read()\nc.rollback()\n")


def test_stop_under_an_external_ledger_lock_stops_the_job_at_once_and_keeps_the_rows(daemons, tmp_path: Path) -> None:
    sd = tmp_path / "sd"
    d = daemons(["wrap", "--state-dir", str(sd), "--grace", "30", "--", PY, "-c", WAITER])
    wait_for(lambda: (sd / "job.log").exists() and "alive" in (sd / "job.log").read_text(), timeout=60)
    wait_for(lambda: (sd / "control.sock").exists() and request(sd, "status", {})["pids"], timeout=60)
    pid = request(sd, "status", {})["pids"][0]
    locker = subprocess.Popen([PY, "-c", LOCKER, str(sd / "ledger.sqlite")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert locker.stdout is not None and locker.stdout.readline().strip() == "locked"
        t0 = time.monotonic()
        stop = subprocess.run([PY, "-m", "supervisor", "stop", "--state-dir", str(sd)], cwd=str(ROOT),
                              capture_output=True, text=True, timeout=60)
        assert stop.returncode == 0, stop.stderr
        wait_for(lambda: not pid_alive(pid), timeout=30)
        took = time.monotonic() - t0
        released_at = time.time()
        # The grace is 30 s and the job stops on SIGTERM: the stop is the signal and the reap.
        # Each locked write used to hold the loop 10 s; now one waits 0.1 s. 8 s leaves room for
        # a loaded 2-core machine (a CLI start included) and is below even one old wait.
        assert took < 8.0, f"the job took {took:.1f} s to stop under a locked ledger"
    finally:
        assert locker.stdin is not None
        locker.stdin.close()
        locker.wait(30)
    assert d.wait(60) == 0, d.stderr()[-3000:]
    h = history(sd)
    assert h["state"] == "stopped" and h["attempts"][0]["ended_at"] is not None
    stops = [e for e in h["events"] if e["event"] == "stop_requested"]
    assert len(stops) == 1
    from datetime import datetime

    assert datetime.fromisoformat(stops[0]["at"]).timestamp() < released_at  # its own time, not the replay's
    err = d.stderr()
    assert "event=ledger_write_delayed" in err and "event=ledger_write_recovered" in err
    assert "event=ledger_write_failed" not in err
