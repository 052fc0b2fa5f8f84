"""The demo training job as a real process: checkpoints, deterministic resume, each fault, stop.

A tiny model (d_model 32, one layer, context 32) keeps each launch to about torch's import time.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.demo import DemoLayout, demo_job_argv, format_faults
from tests.util import wait_for

TINY = ["--d-model", "32", "--layers", "1", "--heads", "2", "--context", "32",
        "--batch-size", "8", "--eval-batches", "1", "--warmup", "5"]
BASE_LR = 3e-3


def job_env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TSUP_") and k not in ("LR_SCALE", "RANK", "LOCAL_RANK")}
    env.update(TSUP_RUN_ID="test-run", TSUP_ATTEMPT="0", TSUP_HEARTBEAT_DIR=str(tmp / "hb"),
               TSUP_CHECKPOINT_DIR=str(tmp / "ckpt"), PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def argv(tmp: Path, *args: str, steps: int = 20, every: int = 10, faults: str = "none") -> list[str]:
    return [sys.executable, "-m", "supervisor.demo.train", "--steps", str(steps), "--faults", faults,
            "--checkpoint-dir", str(tmp / "ckpt"), "--checkpoint-every", str(every),
            "--print-every", "1", *TINY, *args]


def run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)


def metrics(stdout: str) -> dict[int, dict[str, float]]:
    """Per-step training lines (those with a loss), keyed by step."""
    out: dict[int, dict[str, float]] = {}
    for line in stdout.splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            if "loss" in rec and "done" not in rec:
                out[rec["step"]] = rec
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, dict[str, float]]]:
    """One fault-free run of 20 steps, launched with the integrator's argv builder."""
    tmp = tmp_path_factory.mktemp("ref")
    cmd = demo_job_argv(sys.executable, tmp, faults=[], seed=3, steps=20, checkpoint_every=10,
                        print_every=1, extra_args=TINY)
    proc = run(cmd, job_env(tmp, TSUP_CHECKPOINT_DIR=str(DemoLayout(tmp).checkpoint_dir)))
    assert proc.returncode == 0, proc.stderr
    return tmp, metrics(proc.stdout)


def test_fault_free_run_writes_checkpoints_metrics_and_summary(reference) -> None:
    tmp, recs = reference
    layout = DemoLayout(tmp)
    assert sorted(p.name for p in layout.checkpoint_dir.glob("step_*.pt")) == [
        "step_000010.pt", "step_000020.pt"]
    assert sorted(recs) == list(range(1, 21))
    for rec in recs.values():
        assert set(rec) >= {"step", "loss", "grad_norm", "tokens_per_sec", "lr"}
        assert math.isfinite(rec["loss"])
    assert recs[20]["loss"] < recs[1]["loss"]  # it learns
    summary = json.loads(layout.summary_file.read_text())
    assert summary["step"] == 20 and math.isfinite(summary["val_loss"])
    # the checkpoint loads with weights_only and carries what a resume needs
    import torch

    state = torch.load(layout.checkpoint_dir / "step_000010.pt", weights_only=True)
    assert state["step"] == 10 and {"model", "optimizer", "rng", "batches_skipped"} <= set(state)


def test_resume_continues_with_the_same_data_order(reference, tmp_path: Path) -> None:
    ref_dir, ref = reference
    ckpt = DemoLayout(ref_dir).checkpoint_dir / "step_000010.pt"
    proc = run(argv(tmp_path, "--seed", "3"), job_env(tmp_path, TSUP_ATTEMPT="1",
                                                      TSUP_RESUME_FROM=str(ckpt)))
    assert proc.returncode == 0, proc.stderr
    resumed = metrics(proc.stdout)
    assert sorted(resumed) == list(range(11, 21))
    for step in range(11, 21):
        assert resumed[step]["loss"] == pytest.approx(ref[step]["loss"], rel=1e-4, abs=1e-5)


def test_nan_fault_prints_nan_at_its_step_and_lr_scale_is_honoured(tmp_path: Path) -> None:
    proc = run(argv(tmp_path, steps=6, faults="nan@4"), job_env(tmp_path, LR_SCALE="0.5"))
    recs = metrics(proc.stdout)
    assert all(math.isfinite(recs[s]["loss"]) for s in (1, 2, 3))
    assert math.isnan(recs[4]["loss"])
    assert '"loss": NaN' in proc.stdout
    assert recs[1]["lr"] == pytest.approx(BASE_LR * 0.5 / 5)  # warm-up step 1 of 5, x LR_SCALE


def test_crash_exits_nonzero_and_spike_raises_the_lr(tmp_path: Path) -> None:
    proc = run(argv(tmp_path, "--lr", "1e-3", steps=10, faults="spike@2,crash@4"), job_env(tmp_path))
    assert proc.returncode != 0
    assert "RuntimeError: demo: simulated crash at step 4" in proc.stderr
    recs = metrics(proc.stdout)
    assert sorted(recs) == [1, 2, 3]
    assert recs[2]["lr"] == pytest.approx(50 * 1e-3 * 2 / 5)  # --lr honoured, then x50


def test_oom_prints_cuda_out_of_memory_and_exits_1(tmp_path: Path) -> None:
    proc = run(argv(tmp_path, steps=10, faults="oom@3"), job_env(tmp_path))
    assert proc.returncode == 1
    assert "Traceback (most recent call last)" in proc.stderr
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB" in proc.stderr


@pytest.mark.slow
def test_corrupt_checkpoint_breaks_the_newest_fires_once_and_bad_resume_raises_lr(tmp_path: Path) -> None:
    faults = "corrupt_ckpt@10,bad_resume"
    first = run(argv(tmp_path, steps=15, every=5, faults=faults), job_env(tmp_path))
    assert first.returncode != 0
    ckpt = tmp_path / "ckpt"
    assert {p.name for p in ckpt.glob("step_*.pt")} == {"step_000005.pt", "step_000010.pt"}
    assert (ckpt / "step_000010.pt").stat().st_size < (ckpt / "step_000005.pt").stat().st_size * 0.75
    # resuming from the newest (what an unverifying supervisor would do) fails with a load error
    broken = run(argv(tmp_path, steps=15, every=5, faults=faults),
                 job_env(tmp_path, TSUP_ATTEMPT="1", TSUP_RESUME_FROM=str(ckpt / "step_000010.pt")))
    assert broken.returncode != 0
    assert "failed to load checkpoint" in broken.stderr
    # from the previous good one it runs to the end: corrupt_ckpt does not fire twice, and
    # bad_resume fires on this (first successful) resume: LR x100; the rollback remedy's
    # skip_batches reaches the job through the client and is kept in later checkpoints
    good = run(argv(tmp_path, steps=15, every=5, faults=faults),
               job_env(tmp_path, TSUP_ATTEMPT="2", TSUP_RESUME_FROM=str(ckpt / "step_000005.pt"),
                       TSUP_SKIP_BATCHES="2"))
    assert good.returncode == 0, good.stderr
    assert "skipping 2 batches" in good.stderr
    import torch

    assert torch.load(ckpt / "step_000015.pt", weights_only=True)["batches_skipped"] == 2
    assert "'bad_resume' fault" in good.stderr and "'corrupt_ckpt' fault" not in good.stderr
    recs = metrics(good.stdout)
    assert recs[6]["lr"] > 50 * BASE_LR  # normally <= BASE_LR
    assert json.loads((ckpt / ".demo_faults_fired").read_text())["fired"] == ["bad_resume", "corrupt_ckpt"]


def _heartbeat_snapshot(hb_dir: Path) -> tuple[tuple[str, int, bytes], ...]:
    files = sorted(p for p in hb_dir.glob("*") if p.is_file() and not p.name.endswith(".tmp"))
    snap = []
    for p in files:
        try:
            snap.append((p.name, p.stat().st_mtime_ns, p.read_bytes()))
        except FileNotFoundError:
            continue  # replaced between glob and read
    return tuple(snap)


def test_hang_stops_heartbeating_until_killed(tmp_path: Path) -> None:
    err = tmp_path / "stderr.txt"
    with open(err, "w") as err_f:
        proc = subprocess.Popen(argv(tmp_path, steps=1000, faults="hang@5"), env=job_env(tmp_path),
                                stdout=subprocess.DEVNULL, stderr=err_f)
    try:
        hb = tmp_path / "hb"
        wait_for(lambda: "'hang' fault" in err.read_text(), timeout=30, what="the hang fault")
        before = wait_for(lambda: _heartbeat_snapshot(hb), timeout=5, what="a heartbeat file")
        # nothing may change while the job hangs: waiting for a change must time out
        with pytest.raises(AssertionError, match="timed out"):
            wait_for(lambda: _heartbeat_snapshot(hb) != before, timeout=1.0, what="a heartbeat")
        assert proc.poll() is None  # still alive, just silent
        proc.send_signal(signal.SIGTERM)  # a hang ignores the stop flag too
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.5)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL


def test_sigterm_writes_a_checkpoint_and_exits_0(tmp_path: Path) -> None:
    out = tmp_path / "stdout.txt"
    with open(out, "w") as out_f:
        proc = subprocess.Popen(argv(tmp_path, steps=100_000, every=100_000), env=job_env(tmp_path),
                                stdout=out_f, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: '"step": 3,' in out.read_text(), timeout=120, what="step 3")  # torch import under load
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    saved = sorted((tmp_path / "ckpt").glob("step_*.pt"))
    assert len(saved) == 1
    step = int(saved[0].stem.split("_")[1])
    assert step >= 3 and f"checkpoint at step {step} written" in stderr


def test_format_faults_checks_names() -> None:
    assert format_faults(None) == "nan,hang,crash,oom,corrupt_ckpt"
    assert format_faults([]) == "none" and format_faults("none") == "none"
    assert format_faults("nan@150, spike") == "nan@150,spike"
    with pytest.raises(ValueError, match="unknown demo fault 'boom'"):
        format_faults("boom")
    with pytest.raises(ValueError, match="whole number"):
        format_faults("nan@x")
