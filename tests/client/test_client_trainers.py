"""Trainer callbacks (supervisor.client.hf / .lightning) with the real libraries, on the CPU, offline.

Each end-to-end case runs a real Trainer in a subprocess with the environment the daemon gives a
job (TSUP_RUN_ID, TSUP_HEARTBEAT_DIR, ...) and checks what the daemon would read: heartbeat files,
metrics-rank0.jsonl, checkpoints and their manifests (through the daemon's own CheckpointService).
The stop and checkpoint-now requests are the real signals: sent from outside while training runs,
or by the job to itself at a fixed step (tests/trainer_scripts/cb_*_train.py --signal) for exact assertions.
"""
from __future__ import annotations

import json
import re
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from supervisor.checkpoints.config import CheckpointsConfig
from supervisor.checkpoints.hashing import DigestCache, file_digest, tree_digest
from supervisor.checkpoints.manifest import read_manifest
from supervisor.checkpoints.service import CheckpointService
from supervisor.client import _checkpoint, _heartbeat, _metrics, _signals
from tests.conftest import history
from tests.util import stacks_and_kill_tree, wait_for

REPO = Path(__file__).resolve().parents[2]
JOBS = REPO / "tests" / "trainer_scripts"
TSUP_VARS = ("TSUP_RUN_ID", "TSUP_ATTEMPT", "TSUP_RESUME_FROM", "TSUP_RESUME_STEP", "TSUP_SKIP_BATCHES",
             "TSUP_HEARTBEAT_DIR", "TSUP_CHECKPOINT_DIR", "TSUP_HEARTBEAT_INTERVAL_S", "TSUP_STOP_SIGNAL",
             "TSUP_CHECKPOINT_SIGNAL", "TSUP_STATE_DIR", "RANK", "LOCAL_RANK", "WORLD_SIZE")


# -- helpers ------------------------------------------------------------------------------------------

def job_env(tmp: Path, supervised: bool = True, **extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in TSUP_VARS}
    env = {**base, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "TSUP_HEARTBEAT_DIR": str(tmp / "hb")}
    if supervised:
        env.update({"TSUP_RUN_ID": "run-cb", "TSUP_ATTEMPT": "1", "TSUP_HEARTBEAT_INTERVAL_S": "0",
                    "TSUP_STOP_SIGNAL": "SIGTERM", "TSUP_CHECKPOINT_SIGNAL": "SIGUSR1",
                    "TSUP_STATE_DIR": str(tmp / "state")})
    env.update(extra)
    return env


def start(script: str, args: list[str], env: dict[str, str], launcher: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    # A session of its own: a job that hangs (ranks that disagree) is killed with all its ranks.
    return subprocess.Popen([sys.executable, *launcher, str(JOBS / script), *args], env=env, cwd=str(REPO),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def finish_all(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[int, list[dict[str, Any]], str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        dumps = stacks_and_kill_tree(proc.pid)  # the ranks of torchrun live in sessions of their own
        out, err = proc.communicate(timeout=30)
        raise AssertionError(f"job did not finish in {timeout}s:\n{out[-3000:]}\n{err[-3000:]}\n{dumps}") from None
    # Found anywhere, not only at a line's start: two ranks share torchrun's stdout, and a rank's
    # write of more than PIPE_BUF bytes (its buffered log lines) may be split by the other's
    # RESULT line, which then follows half a line.
    decoder = json.JSONDecoder()
    results = [decoder.raw_decode(out, m.end())[0] for m in re.finditer(r"RESULT (?=\{)", out)]
    assert results, f"no RESULT line (rc={proc.returncode}):\n{out[-2000:]}\n{err[-3000:]}"
    return proc.returncode, results, err


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[int, dict[str, Any], str]:
    rc, results, err = finish_all(proc, timeout)
    return rc, results[-1], err


def run(script: str, args: list[str], env: dict[str, str]) -> tuple[int, dict[str, Any], str]:
    return finish(start(script, args, env))


def heartbeat(tmp: Path, rank: int = 0) -> dict[str, Any]:
    return json.loads((tmp / "hb" / f"heartbeat-rank{rank}.json").read_bytes())


def heartbeat_step(tmp: Path) -> int:
    try:
        return heartbeat(tmp)["step"] or 0
    except (OSError, ValueError, KeyError):
        return 0


def metric_rows(tmp: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp / "hb" / "metrics-rank0.jsonl").read_text().splitlines()]


def quicklist(directory: Path, tmp: Path, load_test: bool = False) -> dict[str, Any]:
    """The daemon's view of a checkpoint dir: {name: row}."""
    svc = CheckpointService(CheckpointsConfig(settle_s=0, load_test=load_test), directory, tmp / "qstate", None,
                            [], None, write_manifests=False)
    return {Path(r.path).name: r.to_json() for r in svc.quicklist()}


def client_manifest(checkpoint: Path) -> dict[str, Any]:
    mr = read_manifest(checkpoint)
    assert mr.manifest is not None, mr.problem
    assert mr.manifest.origin == "client"
    return dict(mr.manifest.raw)


# -- Hugging Face Trainer -------------------------------------------------------------------------------

@pytest.mark.slow
def test_hf_outside_supervision_the_callback_is_a_noop(tmp_path: Path) -> None:
    out = tmp_path / "out"
    rc, res, err = run("cb_hf_train.py", [str(out), "--max-steps", "4", "--save-steps", "2"],
                       job_env(tmp_path, supervised=False))
    assert rc == 0, err
    assert res["global_step"] == 4 and res["stop_handler"] == "<Handlers.SIG_DFL: 0>"
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-2", "checkpoint-4"]  # no manifests
    assert not (tmp_path / "hb").exists() and "supervisor.client" not in err


def test_hf_heartbeats_metrics_and_checkpoint_now(tmp_path: Path) -> None:
    out = tmp_path / "out"
    rc, res, err = run("cb_hf_train.py", [str(out), "--max-steps", "8", "--logging-steps", "2", "--eval-steps", "4",
                                          "--self-signal", "3:SIGUSR1"],
                       job_env(tmp_path, TSUP_CHECKPOINT_DIR=str(out)))
    assert rc == 0, err
    assert res["global_step"] == 8  # checkpoint-now does not stop training
    hb = heartbeat(tmp_path)
    assert hb["step"] == 8 and hb["state"] == "running" and hb["rank"] == 0 and hb["attempt"] == 1
    rows = metric_rows(tmp_path)
    train = [r for r in rows if "loss" in r]
    assert [r["step"] for r in train] == [2, 4, 6, 8]
    assert all(isinstance(r[k], float) for r in train for k in ("loss", "lr", "grad_norm"))
    # The real global step: the same numbers the Trainer logged at those steps.
    history = json.loads((out / "checkpoint-8" / "trainer_state.json").read_text())["log_history"]
    logged = {h["step"]: h for h in history if "loss" in h}
    assert all(abs(r["loss"] - logged[r["step"]]["loss"]) < 1e-6 for r in train)
    assert [r["step"] for r in rows if "val_loss" in r] == [4, 8]
    # checkpoint-now at step 3 (no save was due), then the Trainer's own final save at 8.
    assert "the supervisor asked for a checkpoint: saving checkpoint-3" in err
    assert sorted(p.name for p in out.iterdir()) == [
        "checkpoint-3", "checkpoint-3.manifest.json", "checkpoint-8", "checkpoint-8.manifest.json"]
    m3, m8 = client_manifest(out / "checkpoint-3"), client_manifest(out / "checkpoint-8")
    assert m3["step"] == 3 and m3["kind"] == "dir" and m3["metrics"] == {"loss": {"value": train[0]["loss"], "step": 2}}
    assert m8["step"] == 8 and m8["metrics"]["val_loss"]["step"] == 8
    assert m8["environment"]["TSUP_RUN_ID"] == "run-cb"
    rows_q = quicklist(out, tmp_path)
    for name, step in (("checkpoint-8", 8), ("checkpoint-3", 3)):
        row = rows_q[name]
        assert row["step"] == step and row["sha256_ok"] is True and row["ready"] is True, row
        assert not any("supervisor wrote" in n for n in row["notes"])
    assert rows_q["checkpoint-8"]["val_metric"]["step"] == 8


@pytest.mark.slow
def test_hf_stop_request_saves_a_checkpoint_and_stops_early(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = start("cb_hf_train.py", [str(out), "--max-steps", "2000", "--logging-steps", "5"],
                 job_env(tmp_path, TSUP_CHECKPOINT_DIR=str(out)))
    try:
        wait_for(lambda: heartbeat_step(tmp_path) >= 3, timeout=60, what="the job's heartbeat at step 3")
        proc.send_signal(signal.SIGTERM)  # what the daemon sends on stop (TSUP_STOP_SIGNAL)
    finally:
        rc, res, err = finish(proc)
    assert rc == 0, err
    step = res["global_step"]
    assert 3 <= step < 2000
    assert f"the supervisor asked the job to stop: saving checkpoint-{step}, stopping" in err
    assert sorted(p.name for p in out.iterdir()) == [f"checkpoint-{step}", f"checkpoint-{step}.manifest.json"]
    assert client_manifest(out / f"checkpoint-{step}")["step"] == step
    assert heartbeat(tmp_path)["step"] == step
    row = quicklist(out, tmp_path, load_test=True)[f"checkpoint-{step}"]
    assert row["ready"] is True and row["step"] == step and row["load_test"]["passed"] is True, row


# -- Lightning ------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_lightning_outside_supervision_the_callback_is_a_noop(tmp_path: Path) -> None:
    root = tmp_path / "root"
    rc, res, err = run("cb_lightning_train.py", [str(root), "--max-steps", "6", "--ckpt-every", "3"],
                       job_env(tmp_path, supervised=False))
    assert rc == 0, err
    assert res["global_step"] == 6 and res["stop_handler"] == "<Handlers.SIG_DFL: 0>"
    assert sorted(p.name for p in (root / "ckpt").iterdir()) == ["epoch=0-step=3.ckpt", "epoch=0-step=6.ckpt"]
    assert not (tmp_path / "hb").exists() and "supervisor.client" not in err


def test_lightning_heartbeats_metrics_and_checkpoint_now(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ck = root / "ckpt"  # the ModelCheckpoint's dir, also the supervisor's
    rc, res, err = run("cb_lightning_train.py", [str(root), "--max-steps", "8", "--log-every", "2", "--val-every", "4",
                                                 "--ckpt-every", "4", "--self-signal", "3:SIGUSR1"],
                       job_env(tmp_path, TSUP_CHECKPOINT_DIR=str(ck)))
    assert rc == 0, err
    assert res["global_step"] == 8
    hb = heartbeat(tmp_path)
    assert hb["step"] == 8 and hb["state"] == "running" and hb["attempt"] == 1
    rows = metric_rows(tmp_path)
    train = [r for r in rows if "loss" in r]
    assert [r["step"] for r in train] == [2, 4, 6, 8] and all(r["lr"] == 0.05 for r in train)
    assert [r["step"] for r in rows if "val_loss" in r] == [4, 8]
    assert "the supervisor asked for a checkpoint: saving a checkpoint at step 3" in err
    names = sorted(p.name for p in ck.iterdir())
    assert names == sorted(f"epoch=0-step={s}.ckpt{m}" for s in (3, 4, 8) for m in ("", ".manifest.json"))
    for s in (3, 4, 8):  # ours (3) and ModelCheckpoint's (4, 8) alike
        m = client_manifest(ck / f"epoch=0-step={s}.ckpt")
        assert m["step"] == s and m["kind"] == "file"
    assert client_manifest(ck / "epoch=0-step=8.ckpt")["metrics"]["val_loss"]["step"] == 4  # saved before val at 8
    for name, row in quicklist(ck, tmp_path).items():
        assert row["sha256_ok"] is True and row["ready"] is True, (name, row)


@pytest.mark.slow
def test_lightning_stop_request_saves_a_checkpoint_and_stops_early(tmp_path: Path) -> None:
    root, ck = tmp_path / "root", tmp_path / "ck"
    proc = start("cb_lightning_train.py", [str(root), "--max-steps", "20000", "--log-every", "5"],
                 job_env(tmp_path, TSUP_CHECKPOINT_DIR=str(ck)))
    try:
        wait_for(lambda: heartbeat_step(tmp_path) >= 3, timeout=60, what="the job's heartbeat at step 3")
        proc.send_signal(signal.SIGTERM)
    finally:
        rc, res, err = finish(proc)
    assert rc == 0, err  # Lightning ends fit with SIGTERMException (a SystemExit) after the save
    step = res["global_step"]
    assert 3 <= step < 20000
    # Saved at the next step boundary (", stopping"), or, when Lightning's own SIGTERM handler
    # ended fit first (the signal landed between a boundary and the loop's check), in on_exception:
    # the same checkpoint of the same step either way.
    assert f"the supervisor asked the job to stop: saving a checkpoint at step {step}" in err
    name = f"epoch=0-step={step}.ckpt"
    assert sorted(p.name for p in ck.iterdir()) == [name, name + ".manifest.json"]
    assert heartbeat(tmp_path)["step"] == step
    row = quicklist(ck, tmp_path, load_test=True)[name]
    assert row["ready"] is True and row["step"] == step and row["load_test"]["passed"] is True, row


@pytest.mark.slow
def test_lightning_stop_during_validation_saves_the_last_step(tmp_path: Path) -> None:
    root, ck = tmp_path / "root", tmp_path / "ck"
    rc, res, err = run("cb_lightning_train.py", [str(root), "--max-steps", "200", "--val-every", "5",
                                                 "--signal-in-val"],
                       job_env(tmp_path, TSUP_CHECKPOINT_DIR=str(ck)))
    assert rc == 0, err
    assert res["global_step"] == 5
    assert sorted(p.name for p in ck.iterdir()) == ["epoch=0-step=5.ckpt", "epoch=0-step=5.ckpt.manifest.json"]
    assert client_manifest(ck / "epoch=0-step=5.ckpt")["step"] == 5


# -- several ranks: one rank sees the request, all save and stop at the same step ----------------------

@pytest.mark.slow
def test_hf_two_ranks_agree_on_checkpoint_now_and_stop(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = start("cb_hf_train.py", [str(out), "--max-steps", "300", "--self-signal", "3:SIGUSR1",
                                    "--self-signal", "6:SIGTERM", "--self-signal-rank", "1"],
                 job_env(tmp_path, TSUP_CHECKPOINT_DIR=str(out)),
                 launcher=("-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"))
    rc, results, err = finish_all(proc)
    assert rc == 0, err
    assert sorted((r["rank"], r["global_step"]) for r in results) == [(0, 6), (1, 6)]
    for rank in (0, 1):
        hb = heartbeat(tmp_path, rank)
        assert hb["rank"] == rank and hb["world_size"] == 2 and hb["step"] == 6
    rows = quicklist(out, tmp_path)
    for step in (3, 6):  # every rank took part in the save: both RNG states are in the folder
        m = client_manifest(out / f"checkpoint-{step}")
        assert m["step"] == step and {"rng_state_0.pth", "rng_state_1.pth"} <= set(m["files"])
        assert rows[f"checkpoint-{step}"]["sha256_ok"] is True
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["checkpoint-3", "checkpoint-6"]


@pytest.mark.slow
def test_lightning_two_ranks_agree_on_checkpoint_now_and_stop(tmp_path: Path) -> None:
    # SIGUSR2 as the stop signal: Lightning's own SIGTERM handler broadcasts from inside the signal
    # handler, which deadlocks DDP when one rank gets the signal first (see docs/trainers.md).
    root, ck = tmp_path / "root", tmp_path / "ck"
    rc, results, err = finish_all(start(
        "cb_lightning_train.py", [str(root), "--max-steps", "300", "--devices", "2", "--self-signal", "3:SIGUSR1",
                                  "--self-signal", "6:SIGUSR2", "--self-signal-rank", "1"],
        job_env(tmp_path, TSUP_CHECKPOINT_DIR=str(ck), TSUP_STOP_SIGNAL="SIGUSR2")))
    assert rc == 0, err
    assert sorted((r["rank"], r["global_step"]) for r in results) == [(0, 6), (1, 6)]
    assert [heartbeat(tmp_path, r)["step"] for r in (0, 1)] == [6, 6]
    assert sorted(p.name for p in ck.iterdir()) == sorted(
        f"epoch=0-step={s}.ckpt{m}" for s in (3, 6) for m in ("", ".manifest.json"))


# -- with the real daemon ------------------------------------------------------------------------------

def supervisor_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", *args], cwd=str(REPO), capture_output=True, text=True,
                          timeout=120, env={k: v for k, v in os.environ.items() if k not in TSUP_VARS})


@pytest.mark.slow
def test_daemon_checkpoint_now_and_restart_resume_from_the_callbacks_checkpoints(tmp_path: Path, daemons: Any) -> None:
    """checkpoint-now saves and training goes on; a restart stops the job with a checkpoint at its
    current step, which the daemon verifies (the client's manifest) and resumes from."""
    out, state = tmp_path / "out", tmp_path / "state"
    d = daemons(["wrap", "--state-dir", str(state), "--checkpoint-dir", str(out), "--grace", "60",
                 "--resume-arg=--resume={checkpoint}", "--", sys.executable, str(JOBS / "cb_hf_train.py"), str(out),
                 "--max-steps", "100000", "--logging-steps", "5", "--step-s", "0.05"],
                env={"PYTHONPATH": str(REPO)})
    hb0 = state / "heartbeats" / "attempt-0" / "heartbeat-rank0.json"

    def step_of(path: Path) -> int:
        try:
            return json.loads(path.read_bytes())["step"] or 0
        except (OSError, ValueError, KeyError):
            return 0

    wait_for(lambda: step_of(hb0) >= 3, timeout=90, what="attempt 0's heartbeat at step 3")
    assert supervisor_cli("checkpoint-now", "--state-dir", str(state)).returncode == 0
    first = wait_for(lambda: [p for p in out.glob("checkpoint-*.manifest.json")], timeout=60,
                     what="the checkpoint-now checkpoint")[0]
    wait_for(lambda: step_of(hb0) > json.loads(first.read_text())["step"], timeout=60, what="training going on")
    cp = supervisor_cli("restart", "--state-dir", str(state), "--reason", "callback e2e", "--wait")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    attempt1 = history(state)["attempts"][1]
    resumed = Path(attempt1["checkpoint"])
    manifest = client_manifest(resumed)  # the callback's own manifest, not one the daemon wrote
    assert resumed.name == f"checkpoint-{manifest['step']}" and attempt1["resume_step"] == manifest["step"]
    assert manifest["step"] > json.loads(first.read_text())["step"]
    assert f"--resume={resumed}" in attempt1["argv"]
    hb1 = state / "heartbeats" / "attempt-1" / "heartbeat-rank0.json"
    wait_for(lambda: step_of(hb1) > manifest["step"], timeout=90, what="attempt 1 training on from the checkpoint")
    cp = supervisor_cli("stop", "--state-dir", str(state), "--wait")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert d.wait(60) == 0


# -- the HF callback's state machine, in process --------------------------------------------------------

@pytest.fixture
def supervised_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    for v in TSUP_VARS:
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("TSUP_RUN_ID", "run-cb")
    monkeypatch.setenv("TSUP_HEARTBEAT_DIR", str(tmp_path / "hb"))
    monkeypatch.setenv("TSUP_HEARTBEAT_INTERVAL_S", "0")  # every heartbeat is written
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    for mod in (_heartbeat, _metrics, _signals):
        mod._reset_for_tests()
    yield tmp_path
    for mod in (_heartbeat, _metrics, _signals):
        mod._reset_for_tests()
    for s, h in saved.items():
        signal.signal(s, h)


def test_hf_callback_marks_checkpointing_until_on_save_and_saves_once_on_stop(supervised_env: Path) -> None:
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from supervisor.client.hf import SupervisorCallback

    tmp = supervised_env
    args = TrainingArguments(output_dir=str(tmp / "out"), use_cpu=True, report_to="none", save_steps=1000)
    state, control = TrainerState(), TrainerControl()
    cb = SupervisorCallback(hash_in_background=False)
    cb.on_train_begin(args, state, control)
    assert signal.getsignal(signal.SIGTERM) is _signals._on_stop
    state.global_step = 1
    cb.on_step_end(args, state, control)
    assert not control.should_save and heartbeat(tmp)["step"] == 1
    # Formatted strings (what a printing callback may leave) are numbers too.
    cb.on_log(args, state, control, logs={"loss": "2.5", "learning_rate": 1e-3, "epoch": 0.1})
    assert metric_rows(tmp)[-1] == {**metric_rows(tmp)[-1], "step": 1, "loss": 2.5, "lr": 1e-3}

    os.kill(os.getpid(), signal.SIGTERM)  # the supervisor's stop request
    cb.on_step_begin(args, state, control)
    state.global_step = 2
    cb.on_step_end(args, state, control)
    assert control.should_save and control.should_training_stop
    hb = heartbeat(tmp)
    assert hb["state"] == "checkpointing" and hb["step"] == 2
    folder = tmp / "out" / "checkpoint-2"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights")
    control.should_save = False  # the Trainer's CallbackHandler does this before on_save
    cb.on_save(args, state, control)
    assert heartbeat(tmp)["state"] == "running"
    m = client_manifest(folder)
    assert m["step"] == 2 and m["metrics"] == {"loss": {"value": 2.5, "step": 1}}
    # The epoch ends after the stop: no second save of the same step.
    cb.on_epoch_end(args, state, control)
    assert not control.should_save and control.should_training_stop
    cb.on_prediction_step(args, state, control)
    cb.on_train_end(args, state, control)
    assert heartbeat(tmp)["state"] == "running"


# -- record_checkpoint ------------------------------------------------------------------------------------

def _safetensors(size: int) -> bytes:
    """A valid safetensors file of exactly ``size`` bytes: one U8 tensor after a space-padded header."""
    import json
    import struct

    n = size - 200  # the tensor's bytes; the header (with its padding) takes the rest
    header = json.dumps({"w": {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}).encode()
    header += b" " * (size - 8 - n - len(header))
    return struct.pack("<Q", len(header)) + header + b"w" * n


def test_record_checkpoint_writes_the_manifest_the_supervisor_verifies(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    folder = ck / "checkpoint-7"
    (folder / "sub").mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(_safetensors(1000))  # a real one: garbage is refused as corrupt
    (folder / "sub" / "optimizer.pt").write_bytes(b"o" * 500)
    (folder / "trainer_state.json").write_text("{}")  # discovery takes an HF folder for complete with it
    single = ck / "epoch=0-step=9.ckpt"
    single.write_bytes(b"c" * 300)
    mp = _checkpoint.record_checkpoint(folder, step=7, metrics={"val_loss": 1.5})
    assert mp == ck / "checkpoint-7.manifest.json"
    _checkpoint.record_checkpoint(single, step=9, background=True)
    assert _checkpoint._wait_recorded(timeout=30)
    m = client_manifest(folder)
    digest, files = tree_digest(folder, DigestCache(None), "sha256")
    assert m["sha256"] == digest and m["files"] == files and m["size"] == 1502 and m["kind"] == "dir"
    assert m["metrics"] == {"val_loss": {"value": 1.5, "step": 7}}
    assert client_manifest(single)["sha256"] == file_digest(single)
    rows = quicklist(ck, tmp_path)
    assert rows["checkpoint-7"]["sha256_ok"] is True and rows["checkpoint-7"]["val_metric"]["value"] == 1.5
    assert rows["epoch=0-step=9.ckpt"]["sha256_ok"] is True
    (folder / "sub" / "optimizer.pt").write_bytes(b"x" * 500)  # corrupted after the save
    row = quicklist(ck, tmp_path)["checkpoint-7"]
    assert row["sha256_ok"] is False and any("sub/optimizer.pt" in r for r in row["reasons"])


def test_record_checkpoint_misuse_and_orphan_manifests(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="step must be a non-negative int"):
        _checkpoint.record_checkpoint(tmp_path, step=-1)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        _checkpoint.record_checkpoint(tmp_path / "checkpoint-5", step=5)
    gone = tmp_path / "checkpoint-5"
    gone.mkdir()
    _checkpoint.record_checkpoint(gone, step=5)
    gone.rmdir()  # a trainer's rotation deleted it
    theirs = tmp_path / "checkpoint-6.manifest.json"
    theirs.write_text(json.dumps({"origin": "supervisor"}))
    _checkpoint._prune_orphan_manifests(tmp_path, lambda n: n.startswith("checkpoint-"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-6.manifest.json"]


def test_importing_the_client_imports_no_trainer_library() -> None:
    code = ("import sys, supervisor.client as c; assert callable(c.record_checkpoint); "
            "print(sorted(m for m in ('torch', 'transformers', 'pytorch_lightning', 'lightning') if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], env={**job_env(Path("/nonexistent")), "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"
