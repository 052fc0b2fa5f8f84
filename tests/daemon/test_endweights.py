"""The end's weights check (supervisor/daemon/endweights.py) on real checkpoints with the job's
Python, and the words of the end (supervisor/core/runend.py): nothing is called checked that was not."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from supervisor.checkpoints.config import CheckpointsConfig
from supervisor.checkpoints.loadtest import LoadTestResult
from supervisor.checkpoints.service import CheckpointService
from supervisor.core.runend import EndFacts, SourceSeen, Verdict, WeightsCheck, end_verdict
from supervisor.daemon.endweights import check_newest_weights, weights_of


def test_the_newest_checkpoint_is_checked_finite_with_the_jobs_python_and_the_watchdog_fed(tmp_path: Path):
    (tmp_path / "state").mkdir()
    (tmp_path / "ck").mkdir()
    svc = CheckpointService(CheckpointsConfig(settle_s=30.0), tmp_path / "ck", tmp_path / "state", sys.executable,
                            ["python", "train.py"], tmp_path)
    pinged: list[int] = []
    assert check_newest_weights(svc, lambda: pinged.append(1)) == WeightsCheck(
        None, None, note=f"no complete checkpoint in {tmp_path / 'ck'}")
    torch.save({"w": torch.ones(3), "b": torch.zeros(2)}, tmp_path / "ck" / "step_10.pt")
    bad = {"w": torch.full((3,), float("nan")), "b": torch.zeros(2), "v": torch.tensor([float("inf")])}
    torch.save(bad, tmp_path / "ck" / "step_20.pt")  # just written: the job is gone, so settled
    got = check_newest_weights(svc, lambda: pinged.append(1))
    assert got.checkpoint == str(tmp_path / "ck" / "step_20.pt") and got.finite is False
    assert sorted(got.nonfinite) == ["v", "w"] and pinged
    (tmp_path / "ck" / "step_20.pt").unlink()
    assert check_newest_weights(svc, lambda: None) == WeightsCheck(str(tmp_path / "ck" / "step_10.pt"), True)
    svc.close()
    off = CheckpointService(CheckpointsConfig(settle_s=30.0, load_test=False), tmp_path / "ck", tmp_path / "state",
                            sys.executable, ["python", "train.py"], tmp_path)
    w = check_newest_weights(off, lambda: None)  # as a rollback's check: none without load tests
    assert w.finite is None and "load_test = false" in w.note
    off.close()


def test_a_check_that_could_not_judge_is_said_as_not_done():
    failed = LoadTestResult(False, 1.0, "UnpicklingError: truncated")
    assert weights_of("/c/x.pt", failed) == WeightsCheck("/c/x.pt", None, note="the load test of /c/x.pt failed: "
                                                                             "UnpicklingError: truncated")
    dcp = LoadTestResult(True, 1.0, None, notes=("finite check not done for DCP folders (would need the full "
                                                   "model to load into)",))
    w = weights_of("/c/step_5", dcp)
    assert w.finite is None and "finite check not done for DCP folders" in w.note
    v = end_verdict(EndFacts(sources=(SourceSeen("stdout", ("hf",), 3, 30, 100.0),), weights=w), attempt=1,
                    ran_s=60.0, wall=104.0)
    assert v.verdict is Verdict.WATCHED and not v.gave_up and "weights not checked: /c/step_5: finite check not" \
        in v.reason and "finite:" not in v.reason and "last step 30, 4.0 s before the end" in v.reason
