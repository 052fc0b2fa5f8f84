"""Busy or stuck, through the real daemon: a silent job is looked at before it is stopped.

Timeout 2 s ([heartbeat] timeout_s), look 1 s ([heartbeat] look_s): a job silent but busy for
3x the timeout is not stopped (``hang_suspected`` recorded) and finishes; a SIGSTOPped job and
a job blocked in a read are stopped as hung within timeout + look (+ the samples and a poll),
their stacks in the evidence.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import history

PY = sys.executable
TIMEOUT_S, LOOK_S = 2.0, 1.0

JOB = """\
import json, os, signal, sys, time
mode = sys.argv[1]

def forward(n):
    x = 0
    for k in range(n):
        x += k * k
    return x

def score(n):
    y = 0
    for k in range(n):
        y ^= k
    return y

def evaluate(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        forward(20000)
        score(20000)

for step in range(1, 21):
    print(json.dumps({"step": step, "loss": 2.0 - step / 100}), flush=True)
    time.sleep(0.05)
    if step == 10:
        if mode == "busy":
            evaluate(float(sys.argv[2]))  # silent, working
        elif mode == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif mode == "blocked":
            r, w = os.pipe()
            os.read(r, 1)  # a peer that never sends
"""


def run(daemons, tmp_path: Path, *args: str) -> tuple[int, dict]:
    job = tmp_path / "job.py"
    job.write_text(JOB)
    sd = tmp_path / "sd"
    cfg = tmp_path / "tsup.toml"
    cfg.write_text(f"[heartbeat]\nlook_s = {LOOK_S}\n")
    d = daemons(["wrap", "--config", str(cfg), "--state-dir", str(sd), "--max-restarts", "0",
                 "--heartbeat-timeout", f"{TIMEOUT_S:g}", "--", PY, str(job), *args])
    return d.wait(90), history(sd)


@pytest.mark.slow
def test_a_silent_but_busy_job_is_not_stopped_and_finishes(daemons, tmp_path: Path) -> None:
    code, h = run(daemons, tmp_path, "busy", str(3 * TIMEOUT_S))
    assert code == 0, h
    [a] = h["attempts"]
    assert a["exit_code"] == 0 and a["cause"] is None
    suspected = [e for e in h["events"] if e["event"] == "hang_suspected"]
    assert suspected, [e["event"] for e in h["events"]]
    data = suspected[0]["data"]
    assert data["look"]["busy"] and "stacks moved" in data["look"]["reason"]
    assert data["max_busy_s"] == 1800 and Path(data["stacks"]).is_file()
    assert "evaluate" in Path(data["stacks"]).read_text()


def assert_hung_with_stacks(h: dict, state: str, frame: str) -> None:
    [a] = h["attempts"]
    assert a["cause"] == "hang", a
    det = a["detection"]
    look = det["details"]["look"]
    assert not look["busy"] and state in look["reason"], look
    # The bound (hanggate.py): the silence is judged at the timeout (+ up to a 0.25 s poll), the look
    # adds its window and its last py-spy sample, and its verdict is read at the next poll (+ 0.25 s):
    # measured 3.51 s here, over the 3.5 s this said before the samples were allowed for.
    assert det["details"]["age_s"] <= TIMEOUT_S + LOOK_S + 0.5 + 0.5, det
    assert look["seconds"] <= LOOK_S + 2.0, look
    assert "looked" in det["evidence"] and state in det["evidence"]
    stacks = Path(det["details"]["stacks"])
    assert frame in stacks.read_text()
    dumped = [e for e in h["events"] if e["event"] == "stacks_dumped"]
    assert dumped and dumped[0]["data"]["path"] == str(stacks)  # no second dump


def test_a_sigstopped_job_is_hung_within_the_timeout_plus_the_look(daemons, tmp_path: Path) -> None:
    code, h = run(daemons, tmp_path, "stop")
    assert code == 3, json.dumps(h)[-2000:]
    assert_hung_with_stacks(h, "stopped", "<module>")


def test_a_job_blocked_in_a_read_is_hung_within_the_timeout_plus_the_look(daemons, tmp_path: Path) -> None:
    code, h = run(daemons, tmp_path, "blocked")
    assert code == 3, json.dumps(h)[-2000:]
    assert_hung_with_stacks(h, "no CPU", "<module>")
