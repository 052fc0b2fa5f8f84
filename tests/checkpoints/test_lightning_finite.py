"""The finite check on checkpoints written by Lightning's stock ``ModelCheckpoint``.

The checkpoints come from the real trainer (tests/trainer_scripts/lightning_train.py, pytorch_lightning 2.6,
its stock ModelCheckpoint every 5 steps), NaN weights injected after step 7: ``epoch=0-step=5``
is good, ``epoch=0-step=10`` and ``last.ckpt`` hold NaN weights. Every one of them stores
``kth_value = inf`` in the callback state, which made every stock checkpoint "non-finite".
"""
from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from supervisor.checkpoints.config import CheckpointsConfig
from supervisor.checkpoints.layouts import registry
from supervisor.checkpoints.loadtest import LoadTestRequest, run_load_test
from supervisor.checkpoints.service import CheckpointService
from tests.conftest import ROOT
from tests.helpers import ckpt_factory as F

PY = sys.executable


@pytest.fixture(scope="module")
def stock(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real Lightning checkpoints at steps 5 (finite) and 10 (NaN weights since step 7)."""
    work = tmp_path_factory.mktemp("lightning")
    ck = work / "ck"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TSUP_")}
    env.update(FAULT="nan@7", FAULT_MARKER=str(work / "fault_done"))
    res = subprocess.run([PY, str(ROOT / "tests" / "trainer_scripts" / "lightning_train.py"), "--ckpt_dir", str(ck),
                          "--max_steps", "12", "--every_n_steps", "5"], cwd=work, env=env, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    for p in ck.iterdir():
        F.old_mtime(p)
    return ck


def finite_test(path: Path):
    return run_load_test(LoadTestRequest(path, check_finite=True), python=PY, timeout_s=120)


@pytest.mark.slow
def test_a_stock_checkpoint_with_inf_callback_state_passes_the_finite_check(stock: Path) -> None:
    good = stock / "epoch=0-step=5.ckpt"
    raw = torch.load(good, weights_only=True)
    kth = raw["callbacks"][next(k for k in raw["callbacks"] if k.startswith("ModelCheckpoint"))]["kth_value"]
    assert math.isinf(float(kth))  # what used to fail it
    res = finite_test(good)
    assert res.passed and res.error is None and res.step == 5, res
    assert any("finite check: state_dict, optimizer_states" in n for n in res.notes), res.notes


def test_nan_weights_or_optimizer_state_still_fail_and_are_named(stock: Path, tmp_path: Path) -> None:
    res = finite_test(stock / "epoch=0-step=10.ckpt")
    assert not res.passed and res.nonfinite and all(n.startswith(("state_dict.", "optimizer_states"))
                                                    for n in res.nonfinite), res
    assert "non-finite values" in (res.error or "")
    # Finite weights, a NaN only in the optimizer's moments: bad too.
    raw = torch.load(stock / "epoch=0-step=5.ckpt", weights_only=True)
    state = raw["optimizer_states"][0]["state"]
    next(iter(state.values()))["exp_avg"].fill_(math.nan)
    poisoned = tmp_path / "epoch=0-step=6.ckpt"
    torch.save(raw, poisoned)
    res = finite_test(poisoned)
    assert not res.passed and all(n.startswith("optimizer_states") for n in res.nonfinite), res


def test_told_apart_by_content_whatever_the_name(stock: Path, tmp_path: Path) -> None:
    # A custom ModelCheckpoint filename, or a copy: recognised as another layout by its name, still
    # judged by what it holds.
    copy = tmp_path / "model_0005.pt"
    shutil.copy(stock / "epoch=0-step=5.ckpt", copy)
    assert registry.recognise(copy).spec.layout != "lightning"  # type: ignore[union-attr]
    assert finite_test(copy).passed


def test_other_checkpoints_are_still_judged_whole(tmp_path: Path) -> None:
    plain = tmp_path / "step_5.pt"
    torch.save({"model": {"w": torch.ones(2)}, "optimizer": {}, "best_val": torch.tensor(math.inf)}, plain)
    res = finite_test(plain)
    assert not res.passed and res.nonfinite == ("best_val",), res


def test_a_lightning_rollback_goes_to_the_last_finite_checkpoint_not_step_0(stock: Path, tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    svc = CheckpointService(CheckpointsConfig(settle_s=1.0), stock, tmp_path / "state", PY, ["python", "train.py"],
                            tmp_path)
    # The NaN printed first at step 8; step 10's weights are poisoned, step 5 is the target.
    choice = svc.choose_for_resume("rollback", onset_step=11)
    assert choice is not None and choice.step == 5, choice
    assert choice.path == stock / "epoch=0-step=5.ckpt" and not choice.quarantined
