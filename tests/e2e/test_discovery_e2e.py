"""Checkpoint and resume discovery under the real daemon, on the unmodified HF Trainer script
(tests/trainer_scripts/hf_train.py): no --checkpoint-dir, no --resume-arg, and a job that ignores the
checkpoint handed to it (resume_ignored)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from supervisor.ops.control import DaemonNotRunning, ControlError
from supervisor.ops.controlclient import request
from tests.conftest import history
from tests.e2e.test_trainers_e2e import assert_finite_safetensors, attempts, events, hf_cmd, supervise  # noqa: F401 (the fixture)
from tests.util import wait_for

slow = pytest.mark.slow


def bare_wrap(tmp: Path, config: str = "") -> list[str]:
    """`wrap` with no checkpoint dir and no resume args: what a new user types."""
    cfg = tmp / "tsup.toml"
    cfg.write_text("[validation]\nsteps = 5\n" + config)
    return ["wrap", "--config", str(cfg), "--state-dir", str(tmp / "sd"), "--backoff", "0", "--"]


def status_of(sd: Path, d: Any) -> dict[str, Any] | None:
    """The running daemon's status (None while it does not answer); the test fails at once
    when the daemon is gone."""
    assert d.proc.poll() is None, d.stderr()[-3000:]
    try:
        return request(sd, "status", timeout=5.0)
    except (DaemonNotRunning, ControlError, OSError):
        return None


@slow
def test_hf_without_checkpoint_dir_or_resume_arg_resumes_from_its_newest_checkpoint(supervise, tmp_path: Path) -> None:
    out, sd = tmp_path / "out", tmp_path / "sd"
    d = supervise(bare_wrap(tmp_path) + hf_cmd(out, "--max_steps", "20", "--save_steps", "5", "--logging_steps", "1"),
                  fault="crash@13")
    st = wait_for(lambda: (s := status_of(sd, d)) and s.get("checkpoint_dir") and s, 60, 0.1, "status from the daemon")
    assert st["checkpoint_dir"] == {"path": str(out), "found_by": "--output_dir in the command"}, st
    assert st["resume"]["source"] == "inferred" and st["resume"]["args"] == ["--resume_from_checkpoint", "{checkpoint}"]
    assert "HF Trainer" in st["resume"]["note"] and "job.resume_args" in st["resume"]["note"], st["resume"]
    assert d.wait(240) == 0, d.stderr()[-3000:]
    [found] = events(d, "checkpoint_dir_found")
    assert found["path"] == str(out) and "--output_dir" in found["message"], found
    [inferred] = events(d, "resume_inferred")
    assert "--resume_from_checkpoint" in inferred["message"] and "HF Trainer" in inferred["message"], inferred
    a = attempts(sd)
    assert a[0]["cause"] == "crash" and a[0]["exit_code"] == 1 and len(a) == 2 and a[1]["exit_code"] == 0, a
    assert a[1]["checkpoint"] == str(out / "checkpoint-10") and a[1]["resume_step"] == 10, a[1]
    assert a[1]["argv"][-2:] == ["--resume_from_checkpoint", str(out / "checkpoint-10")]
    assert not events(d, "resume_ignored") and not events(d, "resume_unavailable")
    # The crash resumes from the newest verified checkpoint. verify = "overlap" (the default): its
    # load test runs beside the job's start-up, below the job in CPU priority; on a busy machine
    # the 10 steps left can end first, and the daemon then stops the test unfinished. Either way
    # it never failed.
    ck10 = str(out / "checkpoint-10")
    tests = [e for e in events(d, "checkpoint_load_test") if e["path"] == ck10]
    stopped = [e for e in events(d, "checkpoint_load_test_cancelled") if e["path"] == ck10]
    assert tests or stopped, "chosen without a load test"
    assert all(e["passed"].lower() == "true" for e in tests), tests
    # The post-reboot validation passed on numbers, not on the absence of a loss.
    v = a[1]["validation"]
    assert v and v["verdict"] == "pass", v
    loss = v["checks"]["initial_loss"]
    assert isinstance(loss["reference"], float) and isinstance(loss["value"], float) and loss["passed"], v
    assert "no loss" not in json.dumps(v)
    assert_finite_safetensors(out / "model.safetensors")


@slow
def test_a_job_that_ignores_the_checkpoint_is_reported_resume_ignored(supervise, tmp_path: Path) -> None:
    # The resume arg hands the job a flag that is no resume at all (--ignore_data_skip): the HF
    # Trainer starts over at step 1 after being resumed from checkpoint-10. A 0.1 s pause after
    # each step keeps the job running while the status is read (a real step's time, not its CPU).
    out, sd = tmp_path / "out", tmp_path / "sd"
    d = supervise(bare_wrap(tmp_path)[:-1] + ["--resume-arg=--ignore_data_skip", "--"]
                  + hf_cmd(out, "--max_steps", "60", "--save_steps", "5", "--logging_steps", "1",
                           "--step_s", "0.1"), fault="crash@13")
    st = wait_for(lambda: (s := status_of(sd, d)) and s.get("resume_ignored") and s, 180, 0.1,
                  "resume_ignored in status")
    assert st["resume_ignored"]["resume_step"] == 10 and st["resume_ignored"]["first_step"] < 5, st["resume_ignored"]
    assert st["resume"]["source"] == "config", st["resume"]  # explicit resume args win over inference
    assert d.wait(240) == 0, d.stderr()[-3000:]
    [ev] = events(d, "resume_ignored")
    assert "resumed from step 10" in ev["message"] and "--resume-arg" in ev["message"], ev
    h = history(sd)
    assert [e for e in h["events"] if e["event"] == "resume_ignored"], h["events"]
    a = h["attempts"]
    assert len(a) == 2 and a[1]["checkpoint"] == str(out / "checkpoint-10") and a[1]["exit_code"] == 0, a
    v = a[1]["validation"]
    assert v["verdict"] == "fail" and "resume_ignored" in v["summary"] and v["checks"]["resume"]["passed"] is False, v
    assert len(events(d, "restart_scheduled")) == 1  # the crash's; none for resume_ignored: the job kept running


# A plain loop with no flags at all: it saves runs/ckpts/step_N.pt under its working dir every 5
# steps and crashes once at step 12. RESUME is where it reads the checkpoint handed to it, if at all;
# FINISH runs after the last step (a test that must see the daemon act before the job ends waits there).
PLAIN = '''
import os, sys, time
import torch
{resume}
w = torch.zeros(4)
if ckpt:
    state = torch.load(ckpt, weights_only=True)
    start, w = state["step"] + 1, state["w"]
else:
    start = 1
print("checkpoint dir given:", os.environ.get("TSUP_CHECKPOINT_DIR") or "-", flush=True)
os.makedirs("runs/ckpts", exist_ok=True)
for i in range(start, 21):
    w += 0.1
    print(f"iter {{i}}: loss {{2.0 - i * 0.01:.4f}}, time 10.00ms, mfu 0.00%", flush=True)
    if i % 5 == 0:
        torch.save({{"step": i, "w": w}}, f"runs/ckpts/step_{{i}}.pt")
    if i == 12 and not os.path.exists("crashed"):
        open("crashed", "w").close()
        sys.exit(1)
    time.sleep(0.05)
{finish}
'''
READS_ENV = 'ckpt = os.environ.get("TSUP_RESUME_FROM")'
IGNORES = "ckpt = None"


def in_work(tmp: Path) -> str:
    return f'[job]\nworkdir = "{tmp / "work"}"\n'


def plain_job(tmp: Path, resume: str, finish: str = "") -> list[str]:
    work = tmp / "work"
    work.mkdir()
    (work / "train.py").write_text(PLAIN.format(resume=resume, finish=finish))
    return [sys.executable, "train.py"]


@slow
def test_a_checkpoint_dir_found_by_what_appears_under_the_workdir(supervise, tmp_path: Path) -> None:
    sd, ckpts = tmp_path / "sd", tmp_path / "work" / "runs" / "ckpts"
    d = supervise(bare_wrap(tmp_path, in_work(tmp_path))
                  + plain_job(tmp_path, READS_ENV))
    assert d.wait(120) == 0, d.stderr()[-3000:]
    [unknown] = events(d, "checkpoint_dir_unknown")
    assert str(tmp_path / "work") in unknown["message"], unknown
    [found] = events(d, "checkpoint_dir_found")
    # Named by the save it saw: step_10.pt when the job ran on to its crash inside one scan
    # interval, step_5.pt when a periodic scan (a loaded machine, a slow job) came between.
    assert found["path"] == str(ckpts) and ("step_10.pt" in found["message"] or "step_5.pt" in found["message"]), found
    a = attempts(sd)
    assert len(a) == 2 and a[0]["cause"] == "crash" and a[1]["exit_code"] == 0, a
    assert a[1]["checkpoint"] == str(ckpts / "step_10.pt"), a[1]
    assert f"checkpoint dir given: {ckpts}" in d.stdout()  # TSUP_CHECKPOINT_DIR for the later attempt
    assert not events(d, "resume_unavailable") and not events(d, "resume_ignored")  # it reads TSUP_RESUME_FROM


@slow
def test_checkpoints_the_job_cannot_be_handed_are_warned_about_once(supervise, tmp_path: Path) -> None:
    # The check for checkpoints nothing hands over runs every 5 s; the whole run takes about that
    # long, so the relaunched job waits at its end until the warning is out (then ends at once).
    sd = tmp_path / "sd"
    d = supervise(bare_wrap(tmp_path, in_work(tmp_path))
                  + plain_job(tmp_path, IGNORES, finish='while not os.path.exists("go"):\n    time.sleep(0.05)'))
    wait_for(lambda: events(d, "resume_unavailable") or d.proc.poll() is not None, 90,
             what="the resume_unavailable warning (or the daemon's exit)")
    (tmp_path / "work" / "go").touch()
    assert d.wait(120) == 0, d.stderr()[-3000:]
    [warn] = events(d, "resume_unavailable")
    assert warn["level"] == "warning" and "--resume-arg=--resume={checkpoint}" in warn["message"], warn
    # step_10.pt was only in TSUP_RESUME_FROM, which the job does not read: it started over at iter
    # 1, and nothing says it resumed or blames it for ignoring what it never got (issue 35 part 7).
    assert not events(d, "resume_ignored")
    [_, relaunch] = events(d, "job_started")
    assert relaunch["handed"] == "none" and "resuming" not in relaunch["message"], relaunch
    assert "step_10.pt (step 10) is in TSUP_RESUME_FROM only" in relaunch["message"], relaunch
    h = history(sd)
    assert [e["event"] for e in h["events"]].count("resume_unavailable") == 1
    assert h["attempts"][1]["validation"] is None  # no resume to validate
