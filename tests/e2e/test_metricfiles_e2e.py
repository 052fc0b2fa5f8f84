"""Jobs whose metrics reach the supervisor only through the files they write, under the real
daemon with no metric config: an unmodified Lightning 2.x script at its defaults (the Rich bar
prints nothing per step into a pipe; the TensorBoard logger writes event files), and the files of
the CSVLogger and of ``import pytorch_lightning`` read by the daemon's reader; and plain loops writing only JSONL or only
TensorBoard. The daemon runs with PYTHONUNBUFFERED unset (tests/e2e/test_trainers_e2e.py's harness).
"""
from __future__ import annotations

import math
import os
import re
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Sequence

import pytest
import torch

from supervisor.core.observations import MetricRecord
from supervisor.watch.metricfiles import MetricFiles
from supervisor.watch.tbevents import read_file
from supervisor.ops.control import ControlError, DaemonNotRunning
from supervisor.ops.controlclient import request
from tests.conftest import history
from tests.e2e.test_trainers_e2e import JOBS, PY, attempts, events, supervise, wrap  # noqa: F401 (fixture)
from tests.util import wait_for

slow = pytest.mark.slow


def workdir(tmp: Path) -> str:
    return f'[job]\nworkdir = "{tmp}"\n'


def lightning_cmd(tmp: Path, pkg: str, logger: str, *args: str) -> list[str]:
    return [PY, str(JOBS / "lightning_default.py"), "--pkg", pkg, "--logger", logger,
            "--ckpt_dir", str(tmp / "ck"), *args]


LIGHTNING_RESUME = ["--resume-arg=--ckpt_path", "--resume-arg={checkpoint}"]


def ckpt_step(path: str | None) -> int | None:
    m = re.search(r"step=(\d+)(?:-v\d+)?\.ckpt$", path or "")
    return int(m.group(1)) if m else None


def assert_finite_lightning(path: Path) -> None:
    sd = torch.load(path, map_location="cpu", weights_only=False)["state_dict"]
    assert sd and all(torch.isfinite(t).all() for t in sd.values()), path


def ts(ev: dict[str, str]) -> float:
    return datetime.fromisoformat(ev["ts"].replace("Z", "+00:00")).timestamp()


@slow
@pytest.mark.parametrize("pkg,logger", [("pytorch_lightning", "default"), ("lightning", "csv")])
def test_lightning_s_other_loggers_write_the_files_the_daemon_reads(tmp_path: Path, pkg: str, logger: str) -> None:
    # ``import pytorch_lightning`` or the CSVLogger change the job's side only: the daemon's side
    # (metric files found with no config, the NaN in their records judged, the rollback, the resume
    # with --ckpt_path) is the ("lightning", "default") run above and, for a ``file:`` source, the
    # JSONL job below (CSVLogger's header rewrite: tests/watch/test_metricfiles.py, with the real
    # logger). So the stock script runs here without the daemon, and the daemon's own reader
    # (MetricFiles, rooted at the workdir as the daemon roots it) must find its file where
    # Lightning's logger puts it and read every step and the NaN at the same step.
    env = {**os.environ, "FAULT": "nan@12", "FAULT_MARKER": str(tmp_path / "fault_done")}
    env.pop("TSUP_SOCKET", None)
    seen: dict[str, list[MetricRecord]] = {}
    files = MetricFiles([tmp_path], Sink(seen), use_inotify=False)
    try:
        files.baseline()  # before the launch, as the daemon takes it: what the job writes is new
        cp = subprocess.run(lightning_cmd(tmp_path, pkg, logger, "--max_steps", "15",
                                          "--log_every_n_steps", "1"),
                            cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300)
        assert cp.returncode == 0, cp.stderr[-3000:]
        while files.scan_now():
            pass
    finally:
        files.close()
    [(source, records)] = seen.items()
    kind = "tb:" if logger == "default" else "file:"
    assert source.startswith(f"{kind}{tmp_path / 'lightning_logs' / 'version_0'}"), source
    assert all(r.step is not None for r in records if r.loss is not None)
    losses = {r.step: r.loss for r in records if r.loss is not None and r.step is not None}
    assert sorted(losses) == list(range(15)), sorted(losses)  # every step, as Lightning numbers them
    assert all(math.isfinite(losses[s]) for s in range(12)) and math.isnan(losses[12]), losses


class Sink:
    def __init__(self, seen: dict[str, list[MetricRecord]]) -> None:
        self.seen = seen

    def feed_records(self, source: str, records: Sequence[MetricRecord]) -> None:
        self.seen.setdefault(source, []).extend(records)


@slow
def test_lightning_with_not_one_trainer_argument_changed_logs_every_50_steps_and_the_nan_is_still_caught(
        supervise, tmp_path: Path) -> None:
    # Lightning 2.x at its defaults: the Rich bar prints nothing per step into a pipe, the
    # TensorBoard logger writes event files, log_every_n_steps is 50 (the loss is written at steps
    # 49, 99, ...). The NaN from the update of step 60 shows at step 99; the onset is the step after
    # the last finite value (50), so the rollback takes step 25, not step 50 (saved before the NaN,
    # but after the onset). (Once a second run with log_every_n_steps=1 showed the same claims at
    # onset 12; one run at the true defaults shows them all.)
    d = supervise(wrap(tmp_path, "--checkpoint-dir", str(tmp_path / "ck"), *LIGHTNING_RESUME,
                       config=workdir(tmp_path))
                  + lightning_cmd(tmp_path, "lightning", "default", "--max_steps", "125", "--every_n_steps", "25",
                                  "--step_s", "0.05"), fault="nan@60")
    assert d.wait(300) == 0, d.stderr()[-3000:]
    a = attempts(tmp_path / "sd")
    assert a[0]["cause"] == "nan" and a[0]["action"] == "rollback", a[0]
    assert len(a) == 2 and a[1]["exit_code"] == 0, a  # no false NaN from the stopped attempt's last lines
    [nan] = events(d, "failure_detected")
    assert nan["step"] == "99" and nan["onset_step"] == "50", nan
    assert nan["source"].startswith(f"tb:{tmp_path / 'lightning_logs' / 'version_0'}"), nan
    assert ckpt_step(a[1]["checkpoint"]) == 25 and a[1]["argv"][-2:] == ["--ckpt_path", a[1]["checkpoint"]], a[1]
    assert a[1]["resume_step"] == 25
    # The stock checkpoint chosen passed the finite check, its callback state's inf kth_value
    # notwithstanding (once every stock checkpoint failed it, and the rollback started from step 0).
    tested = [e for e in events(d, "checkpoint_load_test") if e["path"] == a[1]["checkpoint"]
              and e["check_finite"].lower() == "true"]
    assert tested and all(e["passed"].lower() == "true" for e in tested), tested
    chosen = [e for e in history(tmp_path / "sd")["events"] if e["event"] == "checkpoint_chosen"]
    assert chosen, [e["event"] for e in history(tmp_path / "sd")["events"]]
    [last] = (tmp_path / "ck").glob("epoch=*-step=125*.ckpt")
    assert_finite_lightning(last)
    callbacks = torch.load(last, map_location="cpu", weights_only=True)["callbacks"]
    assert math.isinf(float(callbacks[next(iter(callbacks))].get("kth_value", math.inf)))
    # Detection delay: from the writer's wall time of the NaN scalar to the daemon's detection.
    ev_files = sorted((tmp_path / "lightning_logs" / "version_0").glob("events.out.tfevents.*"))
    written = min(s.wall_time for f in ev_files for s in read_file(str(f))[0] if math.isnan(s.value))
    delay = ts(nan) - written
    print(f"detection delay (tensorboard, lightning): {delay:.2f} s")
    assert 0 <= delay < 6.0, delay  # a 1 s poll; the rest is a loaded machine


@slow
def test_lightning_at_defaults_hang_is_detected_from_the_step_rhythm_of_its_files(supervise, tmp_path: Path) -> None:
    # No --heartbeat-timeout: the timeout is learned from the steps in the event file. The learned
    # timeout's floor is lowered from 60 s to 3 s ([heartbeat] learn_floor_s) to keep the test short.
    d = supervise(wrap(tmp_path, "--checkpoint-dir", str(tmp_path / "ck"), *LIGHTNING_RESUME,
                       config=workdir(tmp_path) + "[heartbeat]\nlearn_floor_s = 3\n")
                  + lightning_cmd(tmp_path, "lightning", "default", "--max_steps", "45", "--log_every_n_steps", "1"),
                  fault="hang@30")
    assert d.wait(300) == 0, d.stderr()[-3000:]
    a = attempts(tmp_path / "sd")
    assert a[0]["cause"] == "hang" and len(a) == 2 and a[1]["exit_code"] == 0, a
    [learned] = events(d, "step_timeout_learned")[:1]
    assert 3.0 <= float(learned["timeout_s"]) < 60, learned
    assert ckpt_step(a[1]["checkpoint"]) == 30 or ckpt_step(a[1]["checkpoint"]) == 25, a[1]


@slow
def test_lightning_at_its_defaults_hung_at_step_60_is_caught_within_5_minutes_at_the_daemons_defaults(
        supervise, tmp_path: Path) -> None:
    # Lightning at its defaults (the Rich bar prints nothing per step into a pipe, the TensorBoard
    # logger writes a scalar every 50 steps) and the daemon at its defaults: before the hang at step 60
    # the daemon has seen one step, 49, and no interval; the 15 min initial timeout would hold. The
    # first logged step times the rhythm instead (how long the job took from its last start-up line
    # to step 49): provisional, max(60 s floor, that time x 5 x 2), shown in status as it holds.
    sd = tmp_path / "sd"
    d = supervise(wrap(tmp_path, "--checkpoint-dir", str(tmp_path / "ck"), *LIGHTNING_RESUME,
                       config=workdir(tmp_path))
                  + lightning_cmd(tmp_path, "lightning", "default", "--max_steps", "70", "--step_s", "0.02"),
                  fault="hang@60")

    def provisional() -> dict | None:
        try:
            ht = request(sd, "status", timeout=5.0).get("hang_timeout") or {}
        except (ControlError, DaemonNotRunning, OSError):
            return None
        return ht if "first step (49" in str(ht.get("timeout_from")) else None

    ht = wait_for(provisional, timeout=240, interval=0.5, what="status naming the first step's timeout")
    assert ht["signal"] == "steps" and ht["timeout_source"] == "learned" and 60 <= ht["timeout_s"] < 240, ht
    assert "metric file " + str(tmp_path / "lightning_logs" / "version_0") in ht["timeout_from"], ht
    assert d.wait(420) == 0, d.stderr()[-3000:]
    a = attempts(sd)
    assert a[0]["cause"] == "hang" and len(a) == 2 and a[1]["exit_code"] == 0, a
    [hang] = events(d, "hang_detected")
    assert hang["timeout_source"] == "learned" and hang["last_step"] == "49", hang
    hung_at = (tmp_path / "fault_done").stat().st_mtime  # the fault marks its marker as it blocks
    delay = ts(hang) - hung_at
    print(f"hang at step 60 -> detection: {delay:.1f} s (timeout {hang['timeout_s']} s)")
    assert 50 < delay < 300, delay
    assert ckpt_step(a[1]["checkpoint"]) == 55, a[1]  # Lightning runs checkpoint callbacks last: 60 was not saved


@slow
@pytest.mark.parametrize("sink", ["jsonl", "tb"])
def test_a_job_whose_only_metrics_are_a_file_it_writes_is_caught_on_nan(supervise, tmp_path: Path, sink: str) -> None:
    out = tmp_path / "out"
    d = supervise(wrap(tmp_path, config=workdir(tmp_path))
                  + [PY, str(JOBS / "filelog_train.py"), "--out_dir", str(out), "--sink", sink, "--steps", "40"],
                  fault="nan@15")
    assert d.wait(180) == 0, d.stderr()[-3000:]
    a = attempts(tmp_path / "sd")
    assert a[0]["cause"] == "nan" and len(a) == 2 and a[1]["exit_code"] == 0, a
    [nan] = events(d, "failure_detected")
    assert nan["source"].startswith("file:" if sink == "jsonl" else "tb:"), nan
    assert int(nan["step"]) == 16, nan  # the first step computed with the poisoned weights
