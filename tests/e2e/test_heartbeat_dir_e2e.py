"""A hostile heartbeat folder under the real daemon (issue 34 part 3): a job that uses the client
fills its ``TSUP_HEARTBEAT_DIR`` with 100,000 files (10,000 of them under rank names, holding no
record) and puts FIFOs in a rank's heartbeat and metric files' places. Before, the monitor's
first check opened the FIFO for reading on the daemon's loop and hung it for good (``status``
never answered again, no hang was ever detected); a listing of the folder cost each 0.25 s check
~0.2 s. Now ``status`` keeps answering, the daemon's memory stays bounded, and the real rank is
found among the junk and judged hung when it stops beating. The monitor's unit tests:
tests/watch/test_heartbeat_bounds.py."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_hostile_metricfiles_e2e import rss_mb, status_timed
from tests.e2e.test_trainers_e2e import events, supervise, wrap  # noqa: F401 (the fixture)
from tests.util import wait_for

JOB = r'''
import os, sys, time
from supervisor import client
quiet = sys.argv[1]
if os.environ.get("TSUP_ATTEMPT", "0") != "0":
    print("the attempt after the hang: done", flush=True)
    sys.exit(0)
hb = os.environ["TSUP_HEARTBEAT_DIR"]
os.makedirs(hb, exist_ok=True)
for i in range(90_000):
    os.close(os.open(os.path.join(hb, f"junk-{i}"), os.O_CREAT | os.O_WRONLY, 0o644))
for i in range(10_000):
    with open(os.path.join(hb, f"heartbeat-rank{1000 + i}.json"), "wb") as f:
        f.write(b"junk")
os.mkfifo(os.path.join(hb, "heartbeat-rank1.json"))
os.mkfifo(os.path.join(hb, "metrics-rank1.jsonl"))
print("ready", flush=True)
n = 0
while not os.path.exists(quiet):
    n += 1
    client.heartbeat(n)
    if n % 10 == 0:
        print(f"alive {n}", flush=True)  # output too: [heartbeat] timeout_s judges output until a beat is seen
    time.sleep(0.05)
print("no more heartbeats", flush=True)
time.sleep(3600)
'''


def seen_rank0(st: dict[str, Any] | None) -> bool:
    return st is not None and "0" in (st.get("heartbeats") or {})


@pytest.mark.slow
def test_a_heartbeat_dir_of_100000_files_and_a_fifo_keeps_status_answering_and_a_stopped_rank_is_hung(
        supervise, tmp_path: Path) -> None:
    sd, quiet = tmp_path / "sd", tmp_path / "quiet"
    job = tmp_path / "job.py"
    job.write_text(JOB)
    d = supervise(wrap(tmp_path, config="[heartbeat]\ntimeout_s = 5\n") + [sys.executable, str(job), str(quiet)])
    wait_for(lambda: status_timed(sd, d)[0], 60, 0.1, "status from the daemon")
    base = rss_mb(d.proc.pid)
    worst, peak = 0.0, base

    def measured() -> dict[str, Any] | None:
        nonlocal worst, peak
        st, took = status_timed(sd, d)
        assert st is not None, "status did not answer"
        worst, peak = max(worst, took), max(peak, rss_mb(d.proc.pid))
        return st

    # Found among the junk: within a pass through the folder (~50 checks) and the junk under rank
    # names (~40 checks): ~25 s; 120 s on a loaded machine.
    wait_for(lambda: seen_rank0(measured()), 120, 0.2, "rank 0's heartbeat in status")
    wait_for(lambda: events(d, "heartbeat_file_refused"), 30, 0.2, "the FIFO refused")
    quiet.touch()
    [hang] = wait_for(lambda: (measured(), events(d, "hang_detected"))[1], 60, 0.2, "the stopped rank judged hung")
    assert "rank 0 no heartbeat for" in hang["summary"], hang
    assert d.wait(120) == 0, d.stderr()[-3000:]
    assert worst < 2.0, worst  # a FIFO opened on the loop: no answer at all; a whole listing: ~0.2 s a check
    assert peak - base < 40, (base, peak)
    assert len(events(d, "heartbeat_file_refused")) == 1  # said once, not every check
    assert "Traceback" not in d.stderr()
