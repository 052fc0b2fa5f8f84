"""Through the real daemon: a healthy fp16 warm-up is not a divergence (issue 34, G9).

Megatron's initial loss scale is 2^32, halved every 2 overflow steps (hysteresis 2): 32 records in a
row with a finite loss and ``grad_norm inf`` while the printed scale falls, then the run trains. The
20th of them ([detectors.nan] overflow_steps) was rolled back, and the same warm-up after the
rollback gave up as deterministic (exit 3). Now a falling scale is the scaler at work: the run
finishes in one attempt, with the grad_overflow warnings only.
"""
from __future__ import annotations

import sys

import pytest

from tests.conftest import history

PY = sys.executable

WARMUP_JOB = """\
line = %r
sc = 2.0 ** 32
for s in range(1, 33):
    print(line.format(s=s, loss=10.8, g="inf", sc=sc), flush=True)
    if s %% 2 == 0:
        sc /= 2
for s in range(33, 60):
    print(line.format(s=s, loss=round(10.8 - s * 0.01, 3), g="3.2", sc=sc), flush=True)
"""

LINES = ["step {s} loss {loss} grad_norm {g} loss_scale {sc}",
         " iteration {s:8d}/      59 | lm loss: {loss:E} | loss scale: {sc:.1f} | grad norm: {g} | "
         "number of nan iterations:   0 |"]


@pytest.mark.parametrize("line", LINES, ids=["kv", "megatron"])
def test_a_healthy_fp16_warmup_finishes_in_one_attempt(daemons, tmp_path, line):
    sd, job = tmp_path / "sd", tmp_path / "job.py"
    job.write_text(WARMUP_JOB % (line,))
    d = daemons(["wrap", "--state-dir", str(sd), "--backoff", "0", "--", PY, str(job)])
    assert d.wait(90) == 0, d.stderr()[-3000:]
    h = history(sd)
    assert [(a["cause"], a["exit_code"]) for a in h["attempts"]] == [(None, 0)], h["attempts"]
    assert not [e for e in h["events"] if e["event"] in ("failure_detected", "anomaly_detected", "gave_up")]
    # the skipped steps are still said: the 1st and the 10th of the attempt, never a stop
    said = [e["data"]["overflows"] for e in h["events"] if e["event"] == "grad_overflow"]
    assert said == [1, 10], said
