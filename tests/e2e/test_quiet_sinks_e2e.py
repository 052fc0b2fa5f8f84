"""Jobs that print nothing per step and write their metrics where only a search finds them, under
the real daemon with NO metric config (issue 35): a loop logging through a ``logging.FileHandler``
to ``out/train.log``, one through loguru's JSON lines into the same file, and one reporting only
to MLflow at its defaults (MLflow 3: ``./mlflow.db``, read with the stdlib). Each NaN is seen in
that file or store, rolled back, and the run finishes on its second attempt.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_metricfiles_e2e import workdir
from tests.e2e.test_trainers_e2e import JOBS, PY, attempts, events, supervise, wrap  # noqa: F401 (fixture)

slow = pytest.mark.slow


@slow
@pytest.mark.parametrize("sink,source", [("logfile", "log:"), ("loguru", "log:"), ("mlflow", "mlflow:")])
def test_a_quiet_job_s_nan_in_its_own_log_file_or_mlflow_store_is_rolled_back(supervise, tmp_path: Path,
                                                                              sink: str, source: str) -> None:
    out = tmp_path / "out"
    d = supervise(wrap(tmp_path, config=workdir(tmp_path))
                  + [PY, str(JOBS / "filelog_train.py"), "--out_dir", str(out), "--sink", sink, "--steps", "40"],
                  fault="nan@15")
    assert d.wait(240) == 0, d.stderr()[-3000:]
    a = attempts(tmp_path / "sd")
    assert a[0]["cause"] == "nan" and a[0]["action"] == "rollback", a[0]
    assert len(a) == 2 and a[1]["exit_code"] == 0, a
    [nan] = events(d, "failure_detected")
    assert nan["source"].startswith(source), nan
    assert int(nan["step"]) == 16, nan  # the first step computed with the poisoned weights
    found = [e for e in events(d, "metric_file_followed") if e["path"].endswith(("train.log", "mlflow.db"))]
    assert found, "the source found should be said"


BURST = """
import json, time
time.sleep(1.5)
with open("metrics.jsonl", "w") as f:
    for s in range(1, 120001):
        f.write(json.dumps({"step": s, "loss": float("nan") if s == 120000 else 2.0}) + "\\n")
time.sleep(0.5)
"""


@slow
def test_a_metric_burst_written_just_before_the_exit_is_judged_before_the_end(supervise, tmp_path: Path) -> None:
    # 120,000 records (7.2 MB) in one burst, a NaN in the last, exit 0 half a second later: the end
    # waits until the files are read to their end (adversarial round: ~15,000 records were never
    # read and the run "finished" with exit 0 over the NaN).
    (tmp_path / "burst.py").write_text(BURST)
    d = supervise(wrap(tmp_path, "--set", "on.nan.action=give_up", config=workdir(tmp_path))
                  + [PY, str(tmp_path / "burst.py")])
    assert d.wait(240) == 3, d.stderr()[-3000:]
    a = attempts(tmp_path / "sd")
    assert a[0]["cause"] == "nan", a
    [nan] = events(d, "failure_detected")
    assert int(nan["step"]) == 120000 and nan["source"].startswith("file:"), nan


LAST_SECOND = """
import os, time
print("start", flush=True)
time.sleep(1.5)
os.makedirs("out", exist_ok=True)
with open("out/train.log", "w") as f:
    for s in range(1, 30):
        f.write(f"step {s} loss 1.0\\n")
    f.write("step 30 loss nan\\n")
"""


@slow
def test_a_log_file_first_written_in_the_job_s_last_moment_is_read_before_the_end(supervise, tmp_path: Path) -> None:
    # The file appears and the job exits before the next search (about a second) would find it
    # (adversarial round 2: the NaN was detected after the end, which said "finished, watched").
    (tmp_path / "last.py").write_text(LAST_SECOND)
    d = supervise(wrap(tmp_path, "--set", "on.nan.action=give_up", config=workdir(tmp_path))
                  + [PY, str(tmp_path / "last.py")])
    assert d.wait(240) == 3, d.stderr()[-3000:]
    [nan] = events(d, "failure_detected")
    assert int(nan["step"]) == 30 and nan["source"].startswith("log:"), nan
