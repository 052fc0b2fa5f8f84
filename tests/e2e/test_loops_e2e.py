"""Plain PyTorch loops under the real daemon with NO metric config (no regex, no client): one that
logs ``epoch | iter N/M | train_loss=... | lr=...`` through ``logging``, one that shows the loss only
in a tqdm postfix (tests/trainer_scripts/loop_logging_train.py, loop_tqdm_train.py). A NaN injected mid-run is
detected from what they print, the rollback takes the newest checkpoint before the real onset, and
the run finishes with finite weights. ``--checkpoint-dir`` is given (its discovery is tested elsewhere).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.e2e.test_trainers_e2e import JOBS, PY, attempts, events, supervise, wrap  # noqa: F401 (fixture)

slow = pytest.mark.slow


def assert_finite_torch(path: Path) -> None:
    ck = torch.load(path, map_location="cpu", weights_only=True)
    bad = [k for k, t in ck["model"].items() if not bool(torch.isfinite(t).all())]
    assert not bad, f"non-finite tensors in {path}: {bad}"


def loop_flags(tmp: Path, out: Path, window: int = 5) -> list[str]:
    """test_trainers_e2e's ``wrap`` (no backoff, a fresh state dir) with a ``window``-step validation."""
    args = wrap(tmp, "--checkpoint-dir", str(out), "--resume-arg=--resume_from={checkpoint}")
    (tmp / "tsup.toml").write_text(f"[validation]\nsteps = {window}\n")
    return args


@slow
def test_logging_loop_nan_is_found_in_its_log_lines_and_rolled_back_before_the_onset(supervise, tmp_path: Path) -> None:
    # Logs every 10 steps, saves every 20; the weights are NaN after step 58, first printed at iter 60
    # (step_60.pt, saved right after, is poisoned). The onset is the step after the last finite print: 51.
    out = tmp_path / "out"
    # A 20-step validation window: with a print every 10 steps it ends at the second print after the
    # resume (iter 60), not at the twentieth (counting records, it never ended: "incomplete").
    d = supervise(loop_flags(tmp_path, out, window=20) + [PY, str(JOBS / "loop_logging_train.py"), "--out_dir", str(out),
                                               "--steps", "160", "--save_every", "20", "--log_every", "10"],
                  fault="nan@58")
    assert d.wait(240) == 0, d.stderr()[-3000:]
    a = attempts(tmp_path / "sd")
    assert a[0]["cause"] == "nan" and a[0]["action"] == "rollback", a[0]
    [nan] = events(d, "failure_detected")
    assert int(nan["onset_step"]) == 51 and int(nan["step"]) == 60, nan
    assert len(a) == 2 and a[1]["exit_code"] == 0, a
    assert a[1]["checkpoint"] == str(out / "step_40.pt"), a[1]
    assert a[1]["argv"][-1] == f"--resume_from={out / 'step_40.pt'}"
    v = a[1]["validation"]
    assert v and v["verdict"] == "pass" and v["steps"] == 20 and v["records"] == 2, v
    assert_finite_torch(out / "step_160.pt")


@slow
def test_tqdm_loop_nan_onset_is_the_bar_position_and_the_rollback_keeps_the_good_checkpoint(supervise,
                                                                                           tmp_path: Path) -> None:
    # Saves every 25 steps; the weights are NaN after step index 57, so index 58 shows the first NaN
    # in the bar's postfix. Nothing else prints a step: only the bar's counter places the onset, in
    # (50, 58], so ckpt_50.pt (indices < 50) is the newest good one and is the one taken.
    out = tmp_path / "out"
    d = supervise(loop_flags(tmp_path, out) + [PY, str(JOBS / "loop_tqdm_train.py"), "--out_dir", str(out),
                                               "--steps", "200", "--save_every", "25"], fault="nan@57")
    assert d.wait(240) == 0, d.stderr()[-3000:]
    a = attempts(tmp_path / "sd")
    assert a[0]["cause"] == "nan" and a[0]["action"] == "rollback", a[0]
    [nan] = events(d, "failure_detected")
    assert nan.get("onset_step") and 50 < int(nan["onset_step"]) <= 58, nan
    assert len(a) == 2 and a[1]["exit_code"] == 0, a
    assert a[1]["checkpoint"] == str(out / "ckpt_50.pt"), a[1]
    assert_finite_torch(out / "ckpt_200.pt")


@slow
def test_an_iteration_counted_inside_the_epoch_is_read_as_the_global_step(supervise, tmp_path: Path) -> None:
    # The loop prints "epoch 1 | iter 50 | train_loss=..." at step 150 (100 iterations an epoch,
    # `iter` back at 1 every epoch, a print every 10). The weights are NaN after step 150, first
    # printed at step 160: the onset is 151 (not 51), the rollback takes step_140.pt (not step_40.pt),
    # and the resumed attempt's first steps (150, 160 as printed "iter 50", "iter 60") validate
    # against the resume step 140 instead of reading as a job that started over.
    out = tmp_path / "out"
    d = supervise(loop_flags(tmp_path, out, window=20) + [PY, str(JOBS / "loop_logging_train.py"), "--out_dir", str(out),
                                               "--steps", "200", "--save_every", "20", "--log_every", "10",
                                               "--steps_per_epoch", "100", "--epoch_local", "--step_time", "0.005"],
                  fault="nan@150")
    assert d.wait(240) == 0, d.stderr()[-3000:]
    a = attempts(tmp_path / "sd")
    assert a[0]["cause"] == "nan" and a[0]["action"] == "rollback", a[0]
    [nan] = events(d, "failure_detected")
    assert int(nan["step"]) == 160 and int(nan["onset_step"]) == 151, nan
    assert len(a) == 2 and a[1]["exit_code"] == 0, a
    assert a[1]["checkpoint"] == str(out / "step_140.pt") and a[1]["resume_step"] == 140, a[1]
    v = a[1]["validation"]
    assert v and v["verdict"] == "pass" and v["records"] == 2, v
    assert not events(d, "resume_ignored")
    assert_finite_torch(out / "step_200.pt")
