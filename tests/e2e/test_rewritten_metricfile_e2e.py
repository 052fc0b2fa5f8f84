"""A job that prints nothing per step and writes its metrics file once, at its exit, with
``open(path, "w")`` (issue 34, "no false assurance"): its NaN is caught; the next attempt, a fresh
start, rewrites the same bytes (same size, same NaN) and must be caught again, never end
"finished ... watched" over the NaN (before, a file rewritten to its read size was never read again).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_trainers_e2e import PY, attempts, events, supervise, wrap  # noqa: F401 (fixture)

JOB = r'''
import json, os, sys, time
fmt = sys.argv[1]
path = "lightning_logs/version_0/metrics.csv" if fmt == "csv" else "logs/metrics.jsonl"
os.makedirs(os.path.dirname(path), exist_ok=True)
rows = []
for i in range(1, 61):
    v = float("nan") if i >= 40 else 2.0 - i * 0.01
    rows.append(f"{i},{v}\n" if fmt == "csv" else json.dumps({"step": i, "loss": v}) + "\n")
    time.sleep(0.02)
with open(path, "w") as f:  # once, at the end: the same bytes each attempt
    f.write("step,train_loss\n" if fmt == "csv" else "")
    f.writelines(rows)
'''


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_a_fresh_attempt_rewriting_the_same_nan_bytes_is_caught_again(supervise, tmp_path: Path, fmt: str) -> None:
    job = tmp_path / "job.py"
    job.write_text(JOB)
    d = supervise(wrap(tmp_path, "--max-restarts", "1", config=f'[job]\nworkdir = "{tmp_path}"\n')
                  + [PY, str(job), fmt])
    rc = d.wait(180)
    a = attempts(tmp_path / "sd")
    assert len(a) == 2 and all(x["cause"] == "nan" for x in a), a
    assert rc != 0, d.stderr()[-3000:]
    caught = events(d, "failure_detected")
    assert len(caught) == 2 and {int(c["step"]) for c in caught} == {40}, caught
    assert events(d, "gave_up"), d.stderr()[-3000:]
    assert not any("finished" in e.get("message", "") for e in events(d, "daemon_exiting")), events(d, "daemon_exiting")
