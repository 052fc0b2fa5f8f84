"""The checkpoint dir's listing is bounded (issue 34 part 3, checkpoints/listing.py): a folder of
100,000 entries (100x the ``NEWEST_KEPT`` looked at, 5x the ``LISTING_CAP`` read) costs discovery a
bounded time and memory, says so once, and the real daemon's ``status`` keeps answering beside it.
Before, every entry was classified on the daemon's loop each settle window: ~0.5 ms an entry, a
scan of 100,000 took about a minute."""
from __future__ import annotations

import os
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from supervisor.checkpoints.discovery import Discovery
from supervisor.checkpoints.inprogress import in_progress
from supervisor.checkpoints.listing import LISTING_CAP, NEWEST_KEPT, newest_entries
from tests.e2e.test_hostile_metricfiles_e2e import rss_mb, status_timed
from tests.e2e.test_trainers_e2e import events, supervise, wrap  # noqa: F401 (the fixture)
from tests.util import wait_for

ENTRIES = 100 * NEWEST_KEPT


def fill(folder: Path, n: int, *, checkpoints: bool = True) -> None:
    """``n`` empty entries: step files (unless not ``checkpoints``), the job's other files, temp
    names of saves in progress, manifests."""
    folder.mkdir(parents=True, exist_ok=True)
    kinds = 4 if checkpoints else 3
    for i in range(n):
        name = (f"log_{i}.txt", f".step_{i}.pt.tmp", f"step_{i:07d}.pt.manifest.json", f"step_{i:07d}.pt")[i % kinds]
        os.close(os.open(folder / name, os.O_CREAT | os.O_WRONLY, 0o644))


def test_a_dir_of_100x_newest_kept_entries_costs_the_listing_s_bound_and_is_said_once(tmp_path: Path) -> None:
    assert ENTRIES >= 5 * LISTING_CAP
    ck = tmp_path / "ck"
    fill(ck, ENTRIES)
    disc = Discovery(ck, settle_s=0.0)
    with capture_logs() as logs:
        t = time.monotonic()
        found = disc.scan()
        took = time.monotonic() - t
        tracemalloc.start()
        try:
            again = disc.scan()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        Discovery(ck, settle_s=0.0).scan()  # another of the same folder (status' interval advice makes its own)
    assert 0 < len(found) <= NEWEST_KEPT and len(again) == len(found)
    assert took < 10.0, took  # measured: 0.13 s (before: about a minute)
    assert peak < 16 << 20, peak  # measured: ~2 MB (a heap of NEWEST_KEPT, never the listing)
    [said] = [e for e in logs if e["event"] == "checkpoint_dir_listing_capped"]
    assert said["unread"] is True and said["read"] == LISTING_CAP and said["older"] > 0, said
    assert f"more than {LISTING_CAP:,} entries" in said["message"] and "checkpoints.glob" in said["message"]
    writing = in_progress(ck)  # what `checkpoints` lists as being written: the same bound
    assert 0 < len(writing) <= NEWEST_KEPT


def test_the_newest_entries_are_looked_at_and_the_supervisor_s_sidecars_do_not_count(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    ck.mkdir()
    n = 3 * NEWEST_KEPT
    for i in range(n):
        for name in (f"step_{i:07d}.pt", f"step_{i:07d}.pt.manifest.json"):
            p = ck / name
            p.write_bytes(b"")
            os.utime(p, ns=(10**18 + i * 10**9, 10**18 + i * 10**9))  # saved in step order, a second apart
    listing = newest_entries(ck, lambda name: name.endswith(".manifest.json"))
    assert not listing.unread and listing.read == 2 * n and listing.older == n - NEWEST_KEPT
    assert [p.name for p in listing.paths] == [f"step_{i:07d}.pt" for i in range(n - NEWEST_KEPT, n)]
    with capture_logs() as logs:
        steps = [c.step for c in Discovery(ck, settle_s=0.0).scan()]
    assert steps[0] == n - 1 and len(steps) == NEWEST_KEPT and min(s for s in steps if s is not None) == n - NEWEST_KEPT
    assert [e["older"] for e in logs if e["event"] == "checkpoint_dir_listing_capped"] == [n - NEWEST_KEPT]


JOB = r'''
import os, sys, time
stop = sys.argv[1]
step = 0
while not os.path.exists(stop) and step < 3000:
    step += 1
    print(f"step {step} loss {1.0 / step:.4f}", flush=True)
    time.sleep(0.05)
'''


@pytest.mark.slow
def test_the_real_daemon_answers_status_beside_a_checkpoint_dir_of_100000_entries(supervise, tmp_path: Path) -> None:
    ck, sd, stop = tmp_path / "ck", tmp_path / "sd", tmp_path / "stop"
    fill(ck, ENTRIES, checkpoints=False)  # none to load-test or quarantine at the first launch: the listing alone
    job = tmp_path / "job.py"
    job.write_text(JOB)
    d = supervise(wrap(tmp_path, config=f'[checkpoints]\ndir = "{ck}"\nsettle_s = 0.5\n')
                  + [sys.executable, str(job), str(stop)])
    wait_for(lambda: status_timed(sd, d)[0], 60, 0.1, "status from the daemon")
    base = rss_mb(d.proc.pid)
    wait_for(lambda: events(d, "checkpoint_dir_listing_capped"), 60, 0.1, "the listing's bound said")
    worst, peak = 0.0, base
    t0 = time.monotonic()
    while time.monotonic() - t0 < 6:  # a dozen settle windows: a dozen scans of the folder
        st, took = status_timed(sd, d)
        assert st is not None, "status did not answer"
        worst, peak = max(worst, took), max(peak, rss_mb(d.proc.pid))
        time.sleep(0.2)  # the sampling period of the measure
    stop.touch()
    assert d.wait(60) == 0, d.stderr()[-3000:]
    assert worst < 2.0, worst
    assert peak - base < 40, (base, peak)
    assert len(events(d, "checkpoint_dir_listing_capped")) == 1  # said once, not every scan
    assert "Traceback" not in d.stderr()
