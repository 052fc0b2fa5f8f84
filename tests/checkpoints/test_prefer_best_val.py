"""`[checkpoints] prefer = "best_val"`: a rollback is not always best served by the newest
checkpoint before the onset. One whose recorded validation metric is worse than an older one's by
more than the tolerance is passed over, with the reason in the choice."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from supervisor.checkpoints.config import CheckpointsConfig
from supervisor.checkpoints.selection import worse_than_older
from supervisor.checkpoints.service import CheckpointService
from supervisor.client import record_checkpoint
from tests.conftest import history
from tests.helpers import ckpt_factory as F

PY = sys.executable
P = {s: Path(f"step_{s}.pt") for s in (10, 20, 30, 40)}


def test_newer_checkpoints_worse_than_an_older_one_beyond_the_tolerance_are_named():
    vals = [(P[40], 40, 2.03), (P[30], 30, 2.7), (P[20], 20, 2.6), (P[10], 10, 2.0)]  # newest first
    worse = worse_than_older(vals, tolerance=0.02)
    assert set(worse) == {P[30], P[20]}  # 2.03 is within 2 % of 2.0: kept
    assert "2.7 is worse than 2 at step 10 by more than 2%" in worse[P[30]]
    assert worse_than_older(vals, tolerance=0.5) == {}


def test_higher_is_better_and_missing_values_are_never_passed_over():
    vals = [(P[30], 30, 0.61), (P[20], 20, None), (P[10], 10, 0.80)]  # accuracies
    assert set(worse_than_older(vals, tolerance=0.02, higher_is_better=True)) == {P[30]}
    assert worse_than_older(vals, tolerance=0.02) == {}  # as losses the newer 0.61 is the better one
    assert worse_than_older([(P[10], 10, float("nan")), (P[20], 20, 1.0)], tolerance=0.0) == {}


def _saved(ck: Path, step: int, val: float) -> Path:
    path = F.torch_file(ck / f"step_{step}.pt", step)
    record_checkpoint(path, step=step, metrics={"val_loss": val})
    F.old_mtime(path)
    return path


def test_the_service_rolls_back_past_newer_checkpoints_with_a_worse_val_loss(tmp_path: Path) -> None:
    ck, state = tmp_path / "ck", tmp_path / "state"
    state.mkdir()
    for step, val in ((10, 2.0), (20, 2.6), (30, 2.7)):
        _saved(ck, step, val)
    base = CheckpointsConfig(settle_s=0.5)
    newest = CheckpointService(base, ck, state, PY, ["python", "train.py"], tmp_path)
    assert newest.choose_for_resume("rollback", onset_step=35).step == 30  # type: ignore[union-attr]
    best = CheckpointService(dataclasses.replace(base, prefer="best_val"), ck, state, PY, ["python", "train.py"],
                             tmp_path)
    choice = best.choose_for_resume("rollback", onset_step=35)
    assert choice is not None and choice.step == 10, choice
    assert "passed over 2 newer with a worse validation metric" in choice.reason
    assert [Path(p).name for p, _ in choice.skipped] == ["step_30.pt", "step_20.pt"]
    # A restart (a crash, no divergence) still takes the newest: nothing about it is worse.
    assert best.choose_for_resume("restart", None).step == 30  # type: ignore[union-attr]


# The job: the first attempt (handed the newest of three saved checkpoints, val loss 2.0, 2.6, 2.7
# at steps 10, 20, 30) diverges at step 35; the relaunch writes down what it was handed and finishes.
JOB = """
import os, sys
from pathlib import Path
if os.environ["TSUP_ATTEMPT"] != "0":
    Path(sys.argv[1]).write_text(os.environ["TSUP_RESUME_FROM"])
    sys.exit(0)
for i in range(31, 35):
    print(f"iter {i}: loss {2.0 - i * 0.001:.4f}, time 10.00ms, mfu 0.00%", flush=True)
print("iter 35: loss nan, time 10.00ms, mfu 0.00%", flush=True)
import time
time.sleep(60)
"""


@pytest.mark.slow
def test_a_real_rollback_with_prefer_best_val_resumes_from_the_best_recorded_checkpoint(daemons, tmp_path: Path):
    ck, sd, out = tmp_path / "ck", tmp_path / "sd", tmp_path / "resumed"
    for step, val in ((10, 2.0), (20, 2.6), (30, 2.7)):
        _saved(ck, step, val)
    cfg = tmp_path / "tsup.toml"
    cfg.write_text('[checkpoints]\nprefer = "best_val"\nsettle_s = 0.5\n')
    d = daemons(["wrap", "--state-dir", str(sd), "--backoff", "0", "--config", str(cfg), "--checkpoint-dir", str(ck),
                 "--", PY, "-c", JOB, str(out)])
    assert d.wait(120) == 0, d.stderr()[-3000:]
    assert Path(out.read_text()).name == "step_10.pt"
    h = history(sd)
    assert [a["cause"] for a in h["attempts"]] == ["nan", None]
    assert h["attempts"][1]["resume_step"] == 10
    chosen = [e for e in d.events() if "checkpoint_chosen" in e and "step_10.pt" in e]
    assert chosen and "worse validation metric" in chosen[0], d.events()
    assert torch.load(ck / "step_30.pt", weights_only=True)["step"] == 30  # nothing moved or deleted
