"""Hangs at sparse cadences, the false positives, through the real daemon: a job that logs every 10
steps is judged on its own rhythm from its first logged step (provisional, twice the margin), and the
classic false hangs under such a short timeout are not stopped: a silent save (files being written
in the checkpoint dir: activity, no look at all) and a silent evaluation (looked at: busy, so
``hang_suspected``, extended; its next step teaches the pause).

Scaled down through config as tests/e2e/test_ddp_busy.py is: ``learn_floor_s = 3`` (the steps come
every ~0.2 s, so the timeout in force is the floor) and ``look_s = 1``; everything else at its
default. The real-size case (Lightning at its defaults, caught within 5 min) is
tests/e2e/test_metricfiles_e2e.py.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import history

PY = sys.executable
PAUSE_S = 10.0  # well past the timeout in force (3 s) and the look (1 s), also on a loaded machine

JOB = """\
import json, os, sys, time
mode, ck = sys.argv[1], sys.argv[2]
print("ready", flush=True)

def forward(n):
    x = 0
    for k in range(n):
        x += k * k
    return x

def evaluate(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        forward(20000)

for step in range(1, 81):
    time.sleep(0.02)
    if step % 10 == 0:
        print(json.dumps({"step": step, "loss": 2.0 - step / 100}), flush=True)
    if step == 40:
        if mode == "eval":
            evaluate(float(sys.argv[3]))  # silent, working
        else:
            path = os.path.join(ck, "model.bin.tmp")
            end = time.monotonic() + float(sys.argv[3])
            while time.monotonic() < end:  # silent, sleeping between chunks: no CPU to look at
                with open(path, "ab") as f:
                    f.write(b"x" * 4096)
                time.sleep(0.5)
            os.replace(path, os.path.join(ck, "model.bin"))  # as an atomic save ends
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["save", "eval"])
def test_a_pause_longer_than_a_sparse_job_s_timeout_is_no_hang(daemons, tmp_path: Path, mode: str) -> None:
    job = tmp_path / "job.py"
    job.write_text(JOB)
    ck = tmp_path / "ck"
    ck.mkdir()
    cfg = tmp_path / "tsup.toml"
    cfg.write_text("[heartbeat]\nlook_s = 1\nlearn_floor_s = 3\n")
    sd = tmp_path / "sd"
    d = daemons(["wrap", "--config", str(cfg), "--state-dir", str(sd), "--max-restarts", "0",
                 "--checkpoint-dir", str(ck), "--", PY, str(job), mode, str(ck), str(PAUSE_S)])
    assert d.wait(90) == 0, d.stderr()[-3000:]
    h = history(sd)
    [a] = h["attempts"]
    assert a["exit_code"] == 0 and a["cause"] is None, a
    suspected = [e for e in h["events"] if e["event"] == "hang_suspected"]
    if mode == "save":
        assert suspected == [], suspected  # the save's writes are activity: not even looked at
        assert "hang_look_started" not in d.stderr()
    else:
        assert suspected, [e["event"] for e in h["events"]]
        data = suspected[0]["data"]
        assert data["look"]["busy"] and "timeout 3 s, learned" in data["summary"], data
