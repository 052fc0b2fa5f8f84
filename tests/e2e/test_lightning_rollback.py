"""A NaN in an unmodified Lightning job with the stock ModelCheckpoint, through the real daemon:
rolled back to the last checkpoint before the onset (not step 0), finished with finite weights.

Before, every stock checkpoint failed the finite check (ModelCheckpoint's ``kth_value`` = inf in
the callback state), so the rollback found no target and started the job from scratch.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from tests.conftest import history
from tests.e2e.test_trainers_e2e import JOBS, PY, attempts, events, supervise, wrap  # noqa: F401 - fixture

STEP = re.compile(r"step=(\d+)\.ckpt$")


@pytest.mark.slow
def test_lightning_nan_rolls_back_to_the_last_stock_checkpoint_before_the_onset(supervise, tmp_path: Path) -> None:
    ck = tmp_path / "ckpt"
    d = supervise(wrap(tmp_path, "--checkpoint-dir", str(ck), "--resume-arg=--ckpt_path", "--resume-arg={checkpoint}")
                  + [PY, str(JOBS / "lightning_train.py"), "--ckpt_dir", str(ck), "--max_steps", "30",
                     "--every_n_steps", "5"], fault="nan@12")
    assert d.wait(300) == 0, d.stderr()[-3000:]
    a = attempts(tmp_path / "sd")
    assert a[0]["cause"] == "nan" and a[0]["action"] == "rollback", a[0]
    assert len(a) == 2 and a[1]["exit_code"] == 0, a
    m = STEP.search(a[1]["checkpoint"] or "")
    assert m is not None and 0 < int(m.group(1)) <= 10, a[1]["checkpoint"]  # epoch=0-step=10.ckpt, not step 0
    assert a[1]["resume_step"] == int(m.group(1)) and a[1]["argv"][-2:] == ["--ckpt_path", a[1]["checkpoint"]]
    # The finite check ran on it and passed, its inf callback state notwithstanding.
    tested = [e for e in events(d, "checkpoint_load_test") if e["path"] == a[1]["checkpoint"]
              and e["check_finite"].lower() == "true"]
    assert tested and all(e["passed"].lower() == "true" for e in tested), tested
    chosen = [e for e in history(tmp_path / "sd")["events"] if e["event"] == "checkpoint_chosen"]
    assert chosen, [e["event"] for e in history(tmp_path / "sd")["events"]]
    final = torch.load(ck / "last.ckpt", weights_only=True)
    assert final["global_step"] == 30
    assert all(bool(torch.isfinite(t).all()) for t in final["state_dict"].values())
    assert math.isinf(float(final["callbacks"][next(iter(final["callbacks"]))].get("kth_value", math.inf)))
