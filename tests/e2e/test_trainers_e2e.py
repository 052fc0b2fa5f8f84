"""Unmodified trainers under the real daemon: the HF Trainer 5.x, a nanoGPT-style script and
PyTorch Lightning (tests/trainer_scripts/), each hurting itself once (NaN, hang, crash) from FAULT.

The job scripts import nothing from the supervisor and read no TSUP_* variable; the daemon runs
with PYTHONUNBUFFERED unset (it must set it for the job itself). Also here: the checkpoint side
of HF folders (discovery, the load test on a real checkpoint-N/, the finite check of rollback
targets) and the checkpoint_load_error rules judged on what the trainers really print.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

from supervisor.checkpoints.config import CheckpointsConfig
from supervisor.checkpoints.discovery import Discovery, Layout, written_by_supervisor
from supervisor.checkpoints.loadtest import LoadTestRequest, LoadTestResult, run_load_test
from supervisor.checkpoints.service import CheckpointService
from supervisor.events import Cause
from supervisor.watch.config import DetectorsConfig, HeartbeatConfig
from supervisor.watch.logwatch import LogWatcher
from tests.conftest import ROOT, Daemon, history, started_daemons
from tests.helpers import ckpt_factory as F

JOBS = ROOT / "tests" / "trainer_scripts"
PY = sys.executable
slow = pytest.mark.slow


# ------------------------------------------------------------------------------ harness

class BareDaemon(Daemon):
    """The real daemon, started without PYTHONUNBUFFERED (conftest's Daemon sets it): the job's
    lines must reach the detectors because the daemon unbuffers the job, not because we did."""

    def __init__(self, args: list[str], tmp: Path, env: dict[str, str]) -> None:
        self.tmp = tmp
        self.stdout_path = tmp / "daemon.stdout"
        self.stderr_path = tmp / "daemon.stderr"
        e = {k: v for k, v in os.environ.items()
             if k not in ("PYTHONUNBUFFERED", "JOURNAL_STREAM", "NOTIFY_SOCKET", "FAULT", "FAULT_MARKER")}
        e.update(env)
        self.proc = subprocess.Popen([PY, "-m", "supervisor", "--log-format", "logfmt", *args], cwd=str(ROOT), env=e,
                                     stdout=open(self.stdout_path, "wb"), stderr=open(self.stderr_path, "wb"),
                                     start_new_session=True)


@pytest.fixture
def supervise(tmp_path: Path) -> Iterator[Any]:
    def make(args: list[str], fault: str = "") -> BareDaemon:
        env = {"FAULT": fault, "FAULT_MARKER": str(tmp_path / "fault_done")} if fault else {}
        return BareDaemon(args, tmp_path, env)

    with started_daemons(make) as start:
        yield start


def wrap(tmp: Path, *flags: str, config: str = "") -> list[str]:
    """`wrap` with a fresh state dir, no backoff and a config that validates 5 steps after a resume."""
    cfg = tmp / "tsup.toml"
    cfg.write_text("[validation]\nsteps = 5\n" + config)
    return ["wrap", "--config", str(cfg), "--state-dir", str(tmp / "sd"), "--backoff", "0", *flags, "--"]


def hf_cmd(out: Path, *args: str) -> list[str]:
    return [PY, str(JOBS / "hf_train.py"), "--output_dir", str(out), *args]


HF_RESUME = ["--checkpoint-dir", "{out}", "--resume-arg=--resume_from_checkpoint", "--resume-arg={checkpoint}"]


def hf_flags(out: Path) -> list[str]:
    return [f.replace("{out}", str(out)) for f in HF_RESUME]


def events(d: Daemon, name: str) -> list[dict[str, str]]:
    """The daemon's logfmt events called ``name``, as dicts (quoted values unquoted)."""
    out = []
    for line in d.events():
        if line.startswith(f"event={name} "):
            out.append({m.group(1): (m.group(3) if m.group(3) is not None else m.group(2))
                        for m in re.finditer(r'(\w+)=(?:"((?:[^"\\]|\\.)*)"|(\S*))', line)})
    return out


def ts(ev: dict[str, str]) -> float:
    return datetime.fromisoformat(ev["ts"].replace("Z", "+00:00")).timestamp()


class OutputClock:
    """Watches the daemon's stdout, where it passes the job's output through chunk by chunk
    (flushed; its job.log is block-buffered): when did the job's last line arrive?"""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.mtimes: set[float] = set()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.mtimes.add(self.path.stat().st_mtime)
            except OSError:
                pass
            time.sleep(0.01)

    def last_line_before(self, t: float) -> float:
        self._stop.set()
        self._t.join()
        return max(m for m in self.mtimes if m <= t)


def attempts(sd: Path) -> list[dict[str, Any]]:
    return history(sd)["attempts"]


def step_of(path: str | None) -> int | None:
    m = re.search(r"checkpoint-(\d+)$", path or "")
    return int(m.group(1)) if m else None


def assert_finite_safetensors(path: Path) -> None:
    from safetensors.torch import load_file

    tensors = load_file(str(path))
    assert tensors, f"{path} holds no tensors"
    bad = [k for k, t in tensors.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    assert not bad, f"non-finite tensors in the final model: {bad}"


# Before a hang is declared the job is looked at for [heartbeat] look_s (CPU time and stack
# samples: busy or stuck?); the stated bound is the timeout + the look + about a second.
LOOK_S = HeartbeatConfig().look_s


def assert_hang_detected_in_time(d: Daemon, clock: OutputClock, limit_s: float) -> dict[str, str]:
    """The hang was declared within ``limit_s`` + the look + 1.5 s of the job's last output line,
    not before ``limit_s``."""
    [ev] = events(d, "hang_detected")
    detected = ts(ev)
    last = clock.last_line_before(detected)
    assert limit_s - 0.5 <= detected - last <= limit_s + LOOK_S + 1.5, (detected - last, ev)
    assert float(ev["age_s"]) <= limit_s + LOOK_S + 1.5
    return ev


# ------------------------------------------------------------------------------ HF Trainer e2e

@slow
def test_hf_nan_rolls_back_before_the_poison_and_finishes_finite(supervise, tmp_path: Path) -> None:
    # NaN weights from the update of step 10: checkpoint-10 (saved right after it) is already
    # poisoned, though the first NaN is only printed at the log of step 15. A 0.1 s pause after
    # each step (a real step's compute, without the CPU) makes tqdm (mininterval 0.1 s) print each
    # step, so the log dicts get their own step, not an earlier one (which would put the onset
    # before checkpoint-10 anyway).
    out = tmp_path / "out"
    d = supervise(wrap(tmp_path, *hf_flags(out)) + hf_cmd(out, "--max_steps", "20", "--save_steps", "5",
                                                         "--logging_steps", "5", "--step_s", "0.1"), fault="nan@10")
    assert d.wait(240) == 0, d.stderr()[-3000:]
    a = attempts(tmp_path / "sd")
    assert a[0]["cause"] == "nan" and a[0]["action"] == "rollback", a[0]
    [nan] = events(d, "failure_detected")
    if int(nan.get("onset_step") or 0) > 10:  # checkpoint-10 lay before the onset: the finite check refused it
        assert any(e["path"] == str(out / "checkpoint-10") and e["check_finite"].lower() == "true"
                   and e["passed"].lower() == "false" for e in events(d, "checkpoint_load_test")), nan
    assert len(a) == 2 and a[1]["exit_code"] == 0
    m = step_of(a[1]["checkpoint"])
    assert m is not None and m < 10, a[1]["checkpoint"]
    assert a[1]["argv"][-2:] == ["--resume_from_checkpoint", str(out / f"checkpoint-{m}")]
    chosen = [e for e in history(tmp_path / "sd")["events"] if e["event"] == "checkpoint_chosen"]
    steps = [step_of(e["data"]["path"]) for e in chosen]
    assert chosen and all(s is not None and s < 10 for s in steps), chosen  # the poisoned ones (>= 10): never
    assert_finite_safetensors(out / "model.safetensors")


@slow
def test_hf_hang_is_detected_from_silence_and_resumed_from_the_newest(supervise, tmp_path: Path) -> None:
    out, timeout = tmp_path / "out", 5.0
    d = supervise(wrap(tmp_path, "--heartbeat-timeout", f"{timeout:g}", *hf_flags(out))
                  + hf_cmd(out, "--max_steps", "20", "--save_steps", "5", "--logging_steps", "1"), fault="hang@12")
    clock = OutputClock(d.stdout_path)
    assert d.wait(240) == 0, d.stderr()[-3000:]
    ev = assert_hang_detected_in_time(d, clock, timeout)
    a = attempts(tmp_path / "sd")
    assert a[0]["cause"] == "hang" and len(a) == 2 and a[1]["exit_code"] == 0
    evidence = json.dumps(a[0]) + json.dumps(ev)
    # The silence, and where: step 11 printed its log; the tqdm bar that labels HF's log dicts is
    # throttled (0.1 s) and its redraw after the dict is an unfinished line, so 10 is tolerated.
    assert "no output line" in evidence and re.search(r"last step 1[01]\b", evidence), evidence
    assert a[1]["checkpoint"] == str(out / "checkpoint-10")  # the newest one
    assert a[1]["argv"][-2:] == ["--resume_from_checkpoint", str(out / "checkpoint-10")]


# The HF crash (crash@13, resumed from the newest verified checkpoint-10 with a numeric validation)
# is tests/e2e/test_discovery_e2e.py::test_hf_without_checkpoint_dir_or_resume_arg_resumes_from_its_newest_checkpoint:
# the same run there finds the checkpoint dir and the resume args by itself (the NaN and hang
# cases above give them explicitly), so one HF run checks both.


# ------------------------------------------------------------------------------ nanoGPT-style e2e

NANO_RESUME = ["--resume-arg=--init_from=resume"]


def nano_cmd(out: Path, *args: str) -> list[str]:
    return [PY, str(JOBS / "nanogpt_train.py"), f"--out_dir={out}", *args]


def assert_nano_resumed_at(d: Daemon, attempt: dict[str, Any], step: int) -> None:
    """The relaunched nanoGPT job went on from ``step``: its first iteration after "Resuming
    training" says so. The ledger's resume_step of a single overwritten ckpt.pt is the step the
    load test beside the start-up read; on a loaded machine the job may finish (or save over the
    file) before that test ends, and then it stays unknown, never wrong."""
    after = d.stdout().split("Resuming training", 1)
    assert len(after) == 2, d.stdout()[-2000:]
    first = re.search(r"^iter (\d+):", after[1], re.M)
    assert first is not None and int(first.group(1)) == step, after[1][:500]
    assert attempt["resume_step"] in (step, None), attempt["resume_step"]


@slow
def test_nanogpt_hang_detected_with_the_learned_timeout(supervise, tmp_path: Path) -> None:
    # No client, no --heartbeat-timeout: the timeout is learned from the printed steps (floor lowered).
    out = tmp_path / "out"
    d = supervise(wrap(tmp_path, "--checkpoint-dir", str(out), *NANO_RESUME,
                       config="[heartbeat]\nlearn_floor_s = 3\n")
                  + nano_cmd(out, "--max_iters=80", "--eval_interval=20"), fault="hang@50")
    clock = OutputClock(d.stdout_path)
    assert d.wait(240) == 0, d.stderr()[-3000:]
    [learned] = events(d, "step_timeout_learned")[:1]
    ev = assert_hang_detected_in_time(d, clock, float(learned["timeout_s"]))
    assert ev["timeout_source"] == "learned" and ev["last_step"] == "50", ev
    a = attempts(tmp_path / "sd")
    assert a[0]["cause"] == "hang" and len(a) == 2 and a[1]["exit_code"] == 0
    assert_nano_resumed_at(d, a[1], 40)
    assert a[1]["argv"][-1] == "--init_from=resume"
    assert a[1]["checkpoint"] == str(out / "ckpt.pt")


@slow
def test_nanogpt_hang_detected_within_the_configured_timeout(supervise, tmp_path: Path) -> None:
    out, timeout = tmp_path / "out", 3.0
    d = supervise(wrap(tmp_path, "--heartbeat-timeout", f"{timeout:g}", "--checkpoint-dir", str(out), *NANO_RESUME)
                  + nano_cmd(out, "--max_iters=60", "--eval_interval=20"), fault="hang@30")
    clock = OutputClock(d.stdout_path)
    assert d.wait(240) == 0, d.stderr()[-3000:]
    ev = assert_hang_detected_in_time(d, clock, timeout)
    assert ev["timeout_source"] == "config"
    a = attempts(tmp_path / "sd")
    assert a[0]["cause"] == "hang" and a[1]["exit_code"] == 0
    assert_nano_resumed_at(d, a[1], 20)


# ------------------------------------------------------------------------------ Lightning e2e

@slow
def test_lightning_crash_resumes_with_ckpt_path(supervise, tmp_path: Path) -> None:
    ck = tmp_path / "ckpt"
    d = supervise(wrap(tmp_path, "--checkpoint-dir", str(ck), "--resume-arg=--ckpt_path", "--resume-arg={checkpoint}")
                  + [PY, str(JOBS / "lightning_train.py"), "--ckpt_dir", str(ck), "--max_steps", "24",
                     "--every_n_steps", "5"], fault="crash@12")
    assert d.wait(240) == 0, d.stderr()[-3000:]
    a = attempts(tmp_path / "sd")
    assert a[0]["cause"] == "crash" and len(a) == 2 and a[1]["exit_code"] == 0
    chosen = Path(a[1]["checkpoint"])
    assert chosen.parent == ck and (re.fullmatch(r"epoch=\d+-step=10\.ckpt", chosen.name) or chosen.name == "last.ckpt")
    assert a[1]["resume_step"] == 10 and a[1]["argv"][-2:] == ["--ckpt_path", str(chosen)]
    v = a[1]["validation"]
    assert v and v["verdict"] == "pass" and isinstance(v["checks"]["initial_loss"]["reference"], float), v


# ------------------------------------------------------------------------------ checkpoint_load_error rules

def detections(lines: list[str]) -> list[Cause]:
    found: list[Any] = []
    w = LogWatcher(DetectorsConfig(), found.append, lambda _r: None)
    for i in range(0, len(lines), 50):
        w.feed("stdout", lines[i:i + 50])
    return [d.cause for d in found]


# Printed on every resume by transformers 5.23 / Lightning 2.6 (tied lm_head, a dataloader without
# state), by torch for a strict=False load: warnings, not load failures.
RESUME_NOISE = [
    "[transformers] There were missing keys in the checkpoint model loaded: ['lm_head.weight'].",
    "[transformers] There were unexpected keys in the checkpoint model loaded: ['transformer.h.0.attn.bias'].",
    "You are resuming training from a checkpoint trained with 4.57.1 of Transformers but your current version is "
    "5.23.0. This is not recommended and could yield to errors or unwanted behaviors.",
    "Restoring states from the checkpoint path at /ck/epoch=0-step=10.ckpt",
    "Restored all states from the checkpoint at /ck/epoch=0-step=10.ckpt",
    "/venv/lib/python3.11/site-packages/pytorch_lightning/loops/training_epoch_loop.py:224: You're resuming from a "
    "checkpoint that ended before the epoch ended and your dataloader is not resumable. This can cause unreliable "
    "results if further training is done. Consider using an end-of-epoch checkpoint or make your dataloader "
    "resumable by implementing the `state_dict` / `load_state_dict` interface.",
    "_IncompatibleKeys(missing_keys=['lm_head.weight'], unexpected_keys=[])",
    "Resuming training from out",
]

# Printed when the load really fails (transformers 5.23, safetensors, torch 2.13, HF Trainer).
LOAD_FAILURES = [
    "safetensors._safetensors_rust.SafetensorError: Error while deserializing header: incomplete metadata, file not "
    "fully covered",
    "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory. This is an "
    "internal miniz error. If you are seeing this error, there is a high likelihood that your checkpoint file is "
    "corrupted.",
    "ValueError: Can't find a valid checkpoint at /out/checkpoint-10",
]


@pytest.mark.parametrize("line", RESUME_NOISE)
def test_resume_warnings_are_not_load_errors(line: str) -> None:
    assert detections(["iter 10: loss 2.0, time 1.0ms, mfu 1.0%", line]) == []


@pytest.mark.parametrize("line", LOAD_FAILURES)
def test_real_load_failures_are_load_errors(line: str) -> None:
    assert detections(["Traceback (most recent call last):", line]) == [Cause.CHECKPOINT_LOAD_ERROR]


# ------------------------------------------------------------------------------ HF checkpoint folders

def test_entries_the_supervisor_writes_are_named_as_such() -> None:
    # For liveness scans of the checkpoint dir: the manifest the background verification writes
    # seconds after a checkpoint is not the job at work.
    ours = ("checkpoint-10.manifest.json", ".checkpoint-10.manifest.json.4242.tmp", "ckpt.pt.manifest.json",
            "last_good", "quarantine", "step_5.pt.quarantine.json", ".ckpt.pt.restore.tmp")
    theirs = ("checkpoint-10", "ckpt.pt", ".ckpt.pt.tmp", "model.safetensors", "epoch=0-step=10.ckpt", "last.ckpt")
    assert all(written_by_supervisor(n) for n in ours)
    assert not any(written_by_supervisor(n) for n in theirs)


def test_hf_folder_being_saved_and_the_final_export_are_not_candidates(tmp_path: Path) -> None:
    done = F.hf_folder(tmp_path, 10)
    saving = tmp_path / "checkpoint-15"  # the Trainer writes trainer_state.json last
    shutil.copytree(done, saving)
    (saving / "trainer_state.json").unlink()
    F.old_mtime(saving)
    for name in ("model.safetensors", "training_args.bin"):  # Trainer.save_model(output_dir) at the end
        shutil.copy(done / ("model.safetensors" if name.endswith("safetensors") else "optimizer.pt"), tmp_path / name)
        F.old_mtime(tmp_path / name)
    found = Discovery(tmp_path, settle_s=1).scan()
    assert [(c.path.name, c.layout, c.step) for c in found] == [("checkpoint-10", Layout.HF, 10)]
    (tmp_path / "other").mkdir()  # training_args.bin is never a checkpoint, HF folders or not
    shutil.copy(tmp_path / "training_args.bin", tmp_path / "other" / "training_args.bin")
    F.old_mtime(tmp_path / "other" / "training_args.bin")
    assert Discovery(tmp_path / "other", settle_s=1).scan() == []


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One real HF run (checkpoint-5, checkpoint-10), then a real resume from a good and from a
    truncated checkpoint: their folders and what they printed."""
    root = tmp_path_factory.mktemp("hf")
    out = root / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("FAULT", "FAULT_MARKER")}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(hf_cmd(out, "--save_steps", "5", "--logging_steps", "5", *args), env=env,
                              capture_output=True, text=True, timeout=300)

    first = run("--max_steps", "10")
    assert first.returncode == 0, first.stderr[-3000:]
    pristine = root / "pristine"
    shutil.copytree(out / "checkpoint-5", pristine / "checkpoint-5")
    shutil.copytree(out / "checkpoint-10", pristine / "checkpoint-10")
    good = run("--max_steps", "12", "--resume_from_checkpoint", str(out / "checkpoint-10"))
    assert good.returncode == 0, good.stderr[-3000:]
    F.truncate(out / "checkpoint-5" / "model.safetensors", 0.6)
    bad = run("--max_steps", "12", "--resume_from_checkpoint", str(out / "checkpoint-5"))
    assert bad.returncode != 0
    return {"pristine": pristine, "good": good.stdout + good.stderr, "bad": bad.stdout + bad.stderr}


def job_lines(text: str) -> list[str]:
    return [l for l in re.split(r"\r\n|\r|\n", text) if l.strip()]


@slow
def test_a_real_hf_resume_is_no_load_error_and_a_real_failed_one_is(hf_run: dict[str, Any]) -> None:
    assert "There were missing keys in the checkpoint model loaded" in hf_run["good"]  # the warning is there
    assert Cause.CHECKPOINT_LOAD_ERROR not in detections(job_lines(hf_run["good"]))
    assert detections(job_lines(hf_run["bad"])) == [Cause.CHECKPOINT_LOAD_ERROR], hf_run["bad"][-2000:]


def load_test(path: Path, **kw: Any) -> LoadTestResult:
    return run_load_test(LoadTestRequest(path, **kw), python=PY, timeout_s=120)


@slow
def test_a_real_hf_folder_passes_the_load_test_without_running_pickled_code(hf_run: dict[str, Any],
                                                                             tmp_path: Path) -> None:
    ck = tmp_path / "checkpoint-10"
    shutil.copytree(hf_run["pristine"] / "checkpoint-10", ck)
    assert {p.name for p in ck.iterdir()} >= {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth",
                                              "trainer_state.json", "training_args.bin"}
    res = load_test(ck, check_finite=True)
    assert res.passed and res.step == 10 and not res.needs_pickle, res
    assert any(n.startswith("training_args.bin: skipped") for n in res.notes), res.notes
    assert not any(n.startswith("rng_state") for n in res.notes)  # loaded, the Trainer's way

    # Each file the Trainer reads on resume is tested: a truncated one fails the checkpoint.
    for name in ("model.safetensors", "optimizer.pt", "rng_state.pth"):
        bad = tmp_path / f"trunc-{name}" / "checkpoint-10"
        shutil.copytree(ck, bad)
        F.truncate(bad / name, 0.5)
        r = load_test(bad)
        assert not r.passed and not r.needs_pickle and r.error, (name, r)
    broken = tmp_path / "state" / "checkpoint-10"
    shutil.copytree(ck, broken)
    (broken / "trainer_state.json").write_text('{"global_step": 10, "log_hist')
    r = load_test(broken)
    assert not r.passed and "trainer_state.json" in (r.error or ""), r

    # An rng_state.pth that needs code to load is refused, and its code never runs.
    canary = tmp_path / "canary"
    evil = tmp_path / "evil" / "checkpoint-10"
    shutil.copytree(ck, evil)
    torch.save({"python": _Canary(str(canary))}, evil / "rng_state.pth")
    r = load_test(evil)
    assert not r.passed and r.needs_pickle and not canary.exists(), r


class _Canary:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


@slow
def test_rollback_skips_a_checkpoint_with_nan_weights_before_the_onset(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    ck.mkdir()
    for step, value in ((5, 1.0), (10, math.nan)):  # weights already NaN at 10; the NaN printed at 15
        torch.save({"model": {"w": torch.full((4,), value)}, "optimizer": {}, "iter": step}, ck / f"step_{step}.pt")
        F.old_mtime(ck / f"step_{step}.pt")
    (tmp_path / "state").mkdir()
    svc = CheckpointService(CheckpointsConfig(settle_s=1.0), ck, tmp_path / "state", PY, ["python", "train.py"],
                            tmp_path)
    assert svc.choose_for_resume("restart", None).step == 10  # type: ignore[union-attr]  # a restart does not look
    choice = svc.choose_for_resume("rollback", onset_step=11)
    assert choice is not None and choice.step == 5, choice
    assert (ck / "step_10.pt").exists() and not choice.quarantined  # intact, just not a rollback target
    row = svc.evaluate(next(c for c in svc.scan() if c.step == 10))
    assert not row.ready and "non-finite" in " ".join(row.reasons)  # the finite result is remembered


# ------------------------------------------------------------------------------ restart at once (issue 11)

def _job_pids(out: Path) -> list[int]:
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(b"nanogpt_train.py" in c for c in cmd) and f"--out_dir={out}".encode() in cmd:
                pids.append(int(p.name))
    return pids


@slow
def test_nanogpt_killed_from_outside_is_relaunched_at_once_not_after_the_backoff(supervise, tmp_path: Path) -> None:
    # The defaults a user gets (backoff_initial_s = 10): an attempt that made progress is relaunched
    # as soon as its process tree is gone, so the fault-to-next-iteration time is the job's start-up.
    out, sd = tmp_path / "out", tmp_path / "sd"
    # hang@50 only holds the job still at iteration 50 (one-shot) so the kill lands at a known point,
    # not in the middle of a save; it is killed long before any hang timeout.
    d = supervise(["wrap", "--state-dir", str(sd), "--checkpoint-dir", str(out), *NANO_RESUME, "--"]
                  + nano_cmd(out, "--max_iters=160", "--eval_interval=20"), fault="hang@50")
    deadline = time.monotonic() + 120
    while "iter 50:" not in d.stdout():
        assert time.monotonic() < deadline and d.proc.poll() is None, d.stderr()[-3000:]
        time.sleep(0.05)
    [pid] = [p for p in _job_pids(out) if p != d.proc.pid]  # the daemon's own argv names the job too
    seen = len(re.findall(r"^iter \d+:", d.stdout(), re.M))
    os.kill(pid, 9)
    killed = time.monotonic()
    while len(re.findall(r"^iter \d+:", d.stdout(), re.M)) <= seen + 3:  # a few lines printed just before
        assert time.monotonic() - killed < 60 and d.proc.poll() is None, d.stderr()[-3000:]
        if "Resuming training" in d.stdout():
            break
        time.sleep(0.02)
    while not re.search(r"Resuming training[\s\S]*^iter \d+:", d.stdout(), re.M):
        assert time.monotonic() - killed < 60 and d.proc.poll() is None, d.stderr()[-3000:]
        time.sleep(0.02)
    fault_to_next = time.monotonic() - killed
    assert d.wait(240) == 0, d.stderr()[-3000:]
    [sched] = events(d, "restart_scheduled")
    assert float(sched["delay_s"]) == 0.0 and sched["delay_reason"].startswith("no delay: the attempt made progress")
    assert "no delay" in sched["message"]
    assert fault_to_next < 9.0, f"fault to next iteration {fault_to_next:.1f} s: a backoff was slept"
    a = attempts(sd)
    assert a[0]["cause"] == "crash" and a[0]["signal"] == "SIGKILL" and a[1]["exit_code"] == 0 and len(a) == 2
    # On a loaded machine the resumed job may save over ckpt.pt (iteration 60) before the load test
    # of the version it resumed from ends: no checkpoint_load_error then, the job goes on.
    assert_nano_resumed_at(d, a[1], 40)


@slow
def test_nanogpt_deterministic_nan_gives_up_on_the_second_identical_failure_in_seconds(supervise,
                                                                                      tmp_path: Path) -> None:
    # A learning rate far too high: NaN within the first iterations, before the first save. The
    # rollback has nowhere to go but scratch, and the same argv fails the same way: the second
    # identical failure gives up (exit 3), no third attempt, no backoff (defaults: 10 s).
    out, sd = tmp_path / "out", tmp_path / "sd"
    t0 = time.monotonic()
    d = supervise(["wrap", "--state-dir", str(sd), "--checkpoint-dir", str(out), *NANO_RESUME, "--"]
                  + nano_cmd(out, "--max_iters=200", "--eval_interval=50", "--learning_rate=50.0"))
    assert d.wait(120) == 3, d.stderr()[-3000:]
    took = time.monotonic() - t0
    a = attempts(sd)
    assert len(a) == 2 and [x["cause"] for x in a] == ["nan", "nan"], a
    [gave_up] = events(d, "gave_up")
    msg = gave_up["message"]
    for part in ("identical to attempt 0", "starting from scratch (no checkpoint)", "no remedy is configured in [on.nan]",
                 "Evidence: ", "Try: lower the learning rate"):
        assert part in msg, (part, msg)
    assert re.search(r"nan at step \d+ again", msg), msg
    assert took < 30, f"gave up after {took:.1f} s"


@slow
def test_nanogpt_nan_from_a_too_high_lr_is_cured_by_a_scale_remedy_on_its_argv(supervise, tmp_path: Path) -> None:
    # [on.nan] scales --learning_rate, a flag already in the argv (nanoGPT's --key=value form): the
    # repeat climbs the ladder at once, the next attempt runs with 50.0 x 0.001 and finishes finite.
    out, sd = tmp_path / "out", tmp_path / "sd"
    cfg = tmp_path / "tsup.toml"
    cfg.write_text('[on.nan]\nremedies = [{ scale = { "--learning_rate" = 0.001 } }]\n')
    d = supervise(["wrap", "--config", str(cfg), "--state-dir", str(sd), "--checkpoint-dir", str(out), *NANO_RESUME,
                   "--"] + nano_cmd(out, "--max_iters=100", "--eval_interval=50", "--learning_rate=50.0"))
    assert d.wait(180) == 0, d.stderr()[-3000:]  # the job itself exits 1 when its final model is not finite
    a = attempts(sd)
    assert [x["cause"] for x in a[:-1]] == ["nan", "nan"] and len(a) == 3, a
    assert "--learning_rate=50.0" in a[0]["argv"] and "--learning_rate=50.0" in a[1]["argv"]
    assert "--learning_rate=0.05" in a[2]["argv"], a[2]["argv"]
    [applied] = events(d, "remedies_applied")
    assert "--learning_rate x 0.001" in applied["message"]
    assert all(float(s["delay_s"]) == 0.0 for s in events(d, "restart_scheduled"))
    assert torch.isfinite(torch.load(out / "ckpt.pt", map_location="cpu")["model"]["lm_head.weight"]).all()


@slow
def test_nanogpt_corrupt_newest_ckpt_resumes_from_the_last_good_copy_kept_in_the_background(supervise,
                                                                                           tmp_path: Path) -> None:
    # The version of ckpt.pt saved at 40 is verified while the job runs and kept in last_good/ at
    # once; the file is then truncated (a bad overwrite) and the job killed: the run resumes from
    # the kept copy restored to out/ckpt.pt, not from scratch, and the bad version is quarantined.
    out, sd = tmp_path / "out", tmp_path / "sd"
    d = supervise(["wrap", "--state-dir", str(sd), "--checkpoint-dir", str(out), "--heartbeat-timeout", "120",
                   *NANO_RESUME, "--"] + nano_cmd(out, "--max_iters=80", "--eval_interval=20"), fault="hang@50")
    lg = out / "last_good" / "ckpt.pt"
    deadline = time.monotonic() + 120
    while not ("iter 50:" in d.stdout() and lg.exists()
               and torch.load(lg, map_location="cpu", weights_only=False)["iter_num"] == 40):
        assert time.monotonic() < deadline and d.proc.poll() is None, d.stderr()[-3000:]
        time.sleep(0.1)
    ckpt = out / "ckpt.pt"
    data = ckpt.read_bytes()
    ckpt.write_bytes(data[: len(data) // 3])  # a save cut short
    [pid] = [p for p in _job_pids(out) if p != d.proc.pid]
    os.kill(pid, 9)
    assert d.wait(240) == 0, d.stderr()[-3000:]
    a = attempts(sd)
    assert a[0]["cause"] == "crash" and a[1]["resume_step"] == 40 and a[1]["checkpoint"] == str(ckpt), a[1]
    assert (out / "quarantine" / "ckpt.pt").stat().st_size == len(data) // 3
    assert events(d, "checkpoint_restored_last_good") or "restored from last_good" in d.stderr()
