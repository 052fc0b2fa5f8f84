"""Line delivery for jobs that know nothing of us, through the real daemon: a Python job that
never flushes is read while it runs (PYTHONUNBUFFERED), and a tqdm-style bar that only ever
writes ``\\r`` gives progress (and so liveness) to a job that prints no newline at all."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from supervisor.watch.config import HeartbeatConfig
from tests.conftest import history
from tests.util import wait_for

PY = sys.executable

# Prints a NaN metric line with a plain print() (no flush), then sleeps far longer than the test.
UNFLUSHED = """\
import time
for step in range(1, 6):
    print(f"iter {step}: loss {'nan' if step == 5 else '2.5'}, time 1.00ms, mfu 1.00%")
time.sleep(600)
"""

# A tqdm-like bar on stderr: "\\r NN%|...| n/total [...]" and never a newline, then a silent hang.
BAR = """\
import os, sys, threading, time
total = 400
for n in range(0, total):
    if n == int(os.environ["HANG_AT"]):
        open(os.environ["HUNG"], "w").write(repr(time.time()))
        threading.Event().wait()
    sys.stderr.write(f"\\r{100 * n // total:3d}%|###       | {n}/{total} [00:01<00:02, 20.00it/s]")
    sys.stderr.flush()
    time.sleep(0.02)
"""


def _env() -> dict[str, str]:
    # The daemon fixture sets PYTHONUNBUFFERED=1 for the daemon; empty is Python's "unset".
    return {"PYTHONUNBUFFERED": ""}


def test_unflushed_python_job_is_read_while_it_runs(daemons, tmp_path: Path) -> None:
    job = tmp_path / "job.py"
    job.write_text(UNFLUSHED)
    sd = tmp_path / "sd"
    d = daemons(["wrap", "--state-dir", str(sd), "--max-restarts", "0", "--", PY, str(job)], env=_env())
    started = time.monotonic()
    assert d.wait(60) == 3  # gave up on the NaN, long before the job's sleep would end
    assert time.monotonic() - started < 30
    a = history(sd)["attempts"][0]
    assert a["cause"] == "nan" and a["detection"]["step"] == 5
    assert a["env"]["PYTHONUNBUFFERED"] == "1"  # what we added is in the ledger


def test_a_bar_written_with_carriage_returns_only_is_progress(daemons, tmp_path: Path) -> None:
    job = tmp_path / "bar.py"
    job.write_text(BAR)
    sd = tmp_path / "sd"
    hung = tmp_path / "hung"
    d = daemons(["wrap", "--state-dir", str(sd), "--max-restarts", "0", "--heartbeat-timeout", "3", "--",
                 PY, str(job)], env={**_env(), "HANG_AT": "150", "HUNG": str(hung)})
    assert d.wait(60) == 3
    det = history(sd)["attempts"][0]["detection"]
    assert det["cause"] == "hang" and det["source"] == "output"
    assert det["step"] == 149  # the bar's last position: the step the job had reached
    assert det["details"]["signal"] == "steps"
    # The timeout, then the look before a hang stop ([heartbeat] look_s: busy or stuck?), + slack.
    assert det["at"] - float(hung.read_text()) < 3 + HeartbeatConfig().look_s + 1.5
    wait_for(lambda: (sd / "job.log").exists(), 5)
    raw = (sd / "job.log").read_bytes()
    assert b"\r" in raw and b"149/400" in raw  # the log copy keeps the bytes as written
