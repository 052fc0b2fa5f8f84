"""A job that prints a burst of metric lines as fast as it can, through the real daemon (issue 25
build 7): every line in job.log and on the console, every metric in the ledger, none dropped.
That the job never waits for the parsers, and the read-back from job.log with its lag, are shown
deterministically (the parsers held still) in tests/job/test_catchup.py. The speed itself (the job's wall time under ``wrap``
against ``| tee``) is measured in bench/bench_core.py (``burst``), not here."""
from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

from tests.conftest import Daemon, started_daemons

PY = sys.executable
N = 50_000
# Each metric line with a line of chatter (10 MB in all: more than the pipe, the socket and the
# keeper's queue hold, so the parsers normally read much of it back from job.log).
JOB = ("import sys\n"
       "w = sys.stdout.write\n"
       "pad = 'the quick brown fox jumps over the lazy dog ' * 3\n"
       "for i in range(int(sys.argv[1])):\n"
       "    w(f'iter {i}: loss {2.0 + (i % 97) * 0.001:.4f}, time 12.34ms, mfu 1.20%\\n')\n"
       "    w(f'[rank0] batch {i} loaded {pad}\\n')\n")


def test_every_line_of_a_metric_burst_is_kept_and_every_metric_booked(tmp_path: Path) -> None:
    sd, own = tmp_path / "sd", tmp_path / "d"
    own.mkdir()
    with started_daemons(lambda: Daemon(["--log-format", "json", "wrap", "--state-dir", str(sd), "--", PY, "-c",
                                         JOB, str(N)], own)) as start:
        d = start()
        assert d.wait(120) == 0, d.stderr()[-3000:]
    log = (sd / "job.log").read_bytes().splitlines()
    assert len(log) == 2 * N and log[-2].startswith(f"iter {N - 1}:".encode())
    assert own.joinpath("daemon.stdout").read_bytes().count(b"\n") == 2 * N  # the console got every line too
    db = sqlite3.connect(sd / "ledger.sqlite")
    try:
        steps = [s for (s,) in db.execute("SELECT step FROM metrics ORDER BY rowid")]
        dropped = db.execute("SELECT COUNT(*) FROM events WHERE event IN ('metrics_dropped', 'output_unparsed')")
        assert dropped.fetchone()[0] == 0
    finally:
        db.close()
    assert steps == list(range(N)), f"{len(steps)} of {N} metrics booked"
    err = d.stderr()
    assert "metrics_dropped" not in err and "output_unparsed" not in err
