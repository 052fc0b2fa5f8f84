"""Metric files found with no config (watch/metricfiles.py) into the real LogWatcher: history is
not replayed, new files are read from their start, Lightning's CSV rewrite delivers no step twice,
JSONL, the walk's limits, and a real SummaryWriter followed while it writes."""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from supervisor.events import Cause
from supervisor.core.observations import Detection, MetricRecord
from supervisor.watch.config import DetectorsConfig
from supervisor.watch.logwatch import LogWatcher
from supervisor.watch.metricfiles import JSONL_PROBE_LINES, MetricFiles
from supervisor.watch.tail import FileTailer
from tests.util import known, wait_for

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "metricfiles"
MANIFEST = json.loads((CORPUS / "manifest.json").read_text())
TB = "events.out.tfevents.1700000000.host.1.0"


class Progress:
    """The heartbeat monitor's side of LogWatcher (ProgressSink): what it was told."""

    def __init__(self) -> None:
        self.steps: list[int | None] = []
        self.times: list[float] = []
        self.outputs = 0

    def note_output(self, now: float, line: str | None = None) -> None:
        self.outputs += 1

    def note_step(self, now: float, step: int | None, origin: str = "", lag: float = 0.0) -> None:
        self.steps.append(step)
        self.times.append(now)


class Watch:
    def __init__(self, roots: list[Path], **kw: Any) -> None:
        self.detections: list[Detection] = []
        self.records: list[MetricRecord] = []
        self.progress = Progress()
        self.lw = LogWatcher(DetectorsConfig(), self.detections.append, self.records.append, progress=self.progress)
        self.mf = MetricFiles(roots, self.lw, **kw)

    def steps(self, source_prefix: str = "") -> list[int | None]:
        return [r.step for r in self.records if r.source.startswith(source_prefix)]


def test_files_from_before_the_run_are_history_and_new_ones_are_read_from_the_start(tmp_path: Path) -> None:
    old = tmp_path / "lightning_logs" / "version_0"
    old.mkdir(parents=True)
    shutil.copy(CORPUS / "lightning_tb.tfevents", old / TB)  # an old run's NaN
    shutil.copy(CORPUS / "lightning_csv.metrics.csv", old / "metrics.csv")
    w = Watch([tmp_path])
    w.mf.baseline()
    w.mf.scan_now()
    assert w.records == [] and w.detections == []
    new = tmp_path / "lightning_logs" / "version_1"
    new.mkdir()
    shutil.copy(CORPUS / "lightning_tb.tfevents", new / TB)
    w.mf.scan_now()
    p = MANIFEST["lightning"]
    assert w.steps() == list(range(p["train_batches"] * p["max_epochs"]))
    [nan] = w.detections
    assert nan.cause is Cause.NAN and nan.source == f"tb:{new / TB}" and nan.step == p["nan_after"]
    assert "loss=nan" in (nan.evidence or "")
    # Liveness learns the step rhythm from file steps (each new step once).
    assert w.progress.steps == list(range(p["train_batches"] * p["max_epochs"]))
    # ... at the writer's own times (all read in one pass, noted as far apart as they were logged).
    assert [r.at for r in w.records] == sorted(r.at for r in w.records)
    gaps = [b - a for a, b in zip(w.progress.times, w.progress.times[1:])]
    walls = [r.at for r in w.records if r.loss is not None]
    assert gaps == pytest.approx([b - a for a, b in zip(walls, walls[1:])], abs=1e-3) and sum(gaps) > 0
    files = w.mf.status()["files"]
    assert isinstance(files, dict) and files[str(new / TB)] == {"kind": "tb", "records": len(w.records), "last_step": 11}
    assert w.lw.status()["formats"] == {"tensorboard": len(w.records)}


def test_lightning_csv_rewrite_with_a_wider_header_delivers_no_step_twice(tmp_path: Path) -> None:
    from lightning.fabric.loggers.csv_logs import _ExperimentWriter  # the writer CSVLogger uses

    w = Watch([tmp_path])
    w.mf.baseline()
    log_dir = tmp_path / "lightning_logs" / "version_0"
    writer = _ExperimentWriter(str(log_dir))
    for step in range(3):
        writer.log_metrics({"train_loss": 2.0 - step * 0.1, "epoch": 0}, step)
        writer.save()
        w.mf.scan_now()
    writer.log_metrics({"val_loss": 1.5, "epoch": 0}, 2)  # a new column: the file is rewritten
    writer.log_metrics({"train_loss": 1.6, "epoch": 0}, 3)
    writer.save()
    assert (log_dir / "metrics.csv").read_text().startswith("epoch,step,train_loss,val_loss")
    w.mf.scan_now()
    writer.log_metrics({"train_loss": math.nan, "epoch": 1}, 4)
    writer.save()
    w.mf.scan_now()
    assert w.steps() == [0, 1, 2, 2, 3, 4]
    assert [r.val_loss for r in w.records if r.val_loss is not None] == [1.5]
    [nan] = w.detections
    assert nan.cause is Cause.NAN and nan.step == 4 and nan.source == f"file:{log_dir / 'metrics.csv'}"


def test_the_captured_csv_logger_file_gives_every_step_with_nan_kept(tmp_path: Path) -> None:
    w = Watch([tmp_path])
    w.mf.baseline()
    shutil.copy(CORPUS / "lightning_csv.metrics.csv", tmp_path / "metrics.csv")
    w.mf.scan_now()
    p = MANIFEST["lightning"]
    train = [r for r in w.records if r.loss is not None]
    assert [r.step for r in train] == list(range(p["train_batches"] * p["max_epochs"]))
    assert [r.step for r in train if math.isnan(known(r.loss))][0] == p["nan_after"]
    assert w.detections[0].step == p["nan_after"]


def test_jsonl_metric_lines_read_as_written_and_other_jsonl_dropped(tmp_path: Path) -> None:
    w = Watch([tmp_path])
    w.mf.baseline()
    m = tmp_path / "out" / "metrics.jsonl"
    m.parent.mkdir()
    with open(m, "w") as f:
        f.write(json.dumps({"config": {"lr": 0.1}}) + "\n")
        for step in range(5):
            f.write(json.dumps({"step": step, "loss": 1.0 / (step + 1), "lr": 0.1}) + "\n")
        f.write('{"step": 5, "loss": Na')  # half a line: not yet
        f.flush()
        w.mf.scan_now()
        assert w.steps() == [0, 1, 2, 3, 4] and w.detections == []
        f.write('N}\n')
    w.mf.scan_now()
    assert w.steps() == [0, 1, 2, 3, 4, 5]
    assert w.detections[0].cause is Cause.NAN and w.detections[0].step == 5
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"text": f"sample {i}"}) + "\n" for i in range(JSONL_PROBE_LINES + 5)))
    w.mf.scan_now()
    files = w.mf.status()["files"]
    assert isinstance(files, dict) and str(data) not in files and len(w.records) == 6


def test_the_walk_skips_venvs_git_the_state_dir_and_deep_trees_and_says_when_capped(tmp_path: Path,
                                                                                     capsys: Any) -> None:
    w = Watch([tmp_path], depth=2, exclude=[tmp_path / "sd"])
    w.mf.baseline()
    rec = json.dumps({"step": 1, "loss": math.nan}) + "\n"
    for d in ["venv1", ".git", "node_modules", "sd/heartbeats", "a/b/c", "x/site-packages", "p/__pycache__"]:
        (tmp_path / d).mkdir(parents=True)
        (tmp_path / d / "m.jsonl").write_text(rec)
    (tmp_path / "venv1" / "pyvenv.cfg").write_text("home = /usr\n")
    w.mf.scan_now()
    assert w.records == [] and w.detections == []  # a/b/c is 3 levels down: past depth 2
    (tmp_path / "a" / "b" / "m.jsonl").write_text(rec)
    w.mf.scan_now()
    assert w.steps() == [1] and w.detections[0].source == f"file:{tmp_path / 'a' / 'b' / 'm.jsonl'}"
    capped = Watch([tmp_path], max_dirs=2)
    capped.mf.baseline()
    assert capped.mf.status()["capped"] is True
    capped.mf.scan_now()
    assert capped.mf.capped


def test_a_root_added_later_reads_its_new_files_not_its_old_ones(tmp_path: Path) -> None:
    cwd, out = tmp_path / "cwd", tmp_path / "elsewhere"
    cwd.mkdir()
    out.mkdir()
    w = Watch([cwd])
    w.mf.baseline()
    old = out / "old.jsonl"
    old.write_text(json.dumps({"step": 1, "loss": math.nan}) + "\n")
    past = time.time() - 3600
    os.utime(old, (past, past))
    (out / "new.jsonl").write_text(json.dumps({"step": 7, "loss": 0.5}) + "\n")
    w.mf.add_root(out)
    w.mf.add_root(out / "sub")  # under a root already: nothing new
    assert w.mf.roots == (str(cwd.resolve()), str(out.resolve()))
    w.mf.scan_now()
    assert w.steps() == [7] and w.detections == []


def test_an_event_file_named_in_watch_files_is_read_as_tensorboard_not_as_text(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    glob = str(logs / "*")
    w = Watch([], globs=[glob])
    tailer = FileTailer([glob], tmp_path, w.lw, use_inotify=False)
    w.mf.baseline()
    tailer.baseline()
    shutil.copy(CORPUS / "torch_writer.tfevents", logs / TB)
    tailer.scan_now()
    w.mf.scan_now()
    assert tailer.status()["files"] == {}  # the line tailer leaves it alone
    assert w.records and all(r.source == f"tb:{logs / TB}" for r in w.records)
    assert w.detections[0].step == MANIFEST["torch_writer"]["nan_step"]
    tailer.close()


@pytest.mark.slow
def test_a_real_summary_writer_is_followed_while_it_writes(tmp_path: Path) -> None:
    # SummaryWriter in a child (torch stays out of this process's watch code path), flushing each
    # step; the monitor's own thread follows the file as it grows.
    script = tmp_path / "w.py"
    go = tmp_path / "go"
    script.write_text(f"""
import math, os, sys, time
from torch.utils.tensorboard import SummaryWriter
w = SummaryWriter(log_dir={str(tmp_path / 'runs')!r})
for step in range(6):
    w.add_scalar("train/loss", 1.0 + step, step)
    w.flush()
    while not os.path.exists({str(go)!r} + str(step)):
        time.sleep(0.01)
w.add_scalar("train/loss", math.nan, 6)
w.close()
""")
    w = Watch([tmp_path], poll_interval_s=0.05)
    w.mf.start()
    proc = subprocess.Popen([sys.executable, str(script)])
    try:
        for step in range(6):
            wait_for(lambda: step in w.steps(), timeout=60, what=f"step {step} read from the growing file")
            (tmp_path / f"go{step}").touch()
        wait_for(lambda: w.detections, timeout=60, what="the NaN of step 6")
        assert proc.wait(60) == 0
    finally:
        proc.kill()
        w.mf.stop()
    assert w.steps() == list(range(7)) and w.detections[0].step == 6


def test_what_a_stopped_attempt_wrote_after_its_end_is_not_judged_as_the_next_attempts(tmp_path: Path) -> None:
    # A job stopped after a NaN logs on until it exits; the next attempt's baseline reads that
    # tail without delivering it (it was a false second NaN at the relaunch).
    w = Watch([tmp_path])
    w.mf.baseline()
    m = tmp_path / "m.jsonl"
    line = lambda step, loss: json.dumps({"step": step, "loss": loss}) + "\n"  # noqa: E731
    m.write_text(line(1, 1.0) + line(2, math.nan))
    w.mf.scan_now()
    assert w.steps() == [1, 2] and len(w.detections) == 1
    with open(m, "a") as f:
        f.write(line(3, math.nan))
    (tmp_path / "late.jsonl").write_text(line(3, math.nan))  # a file the old attempt created after the last pass
    w.lw.reset(1, 1)
    w.mf.baseline()  # before the next attempt's spawn
    w.mf.scan_now()
    assert w.steps() == [1, 2] and len(w.detections) == 1
    with open(m, "a") as f:
        f.write(line(2, 0.9))
    w.mf.scan_now()
    assert w.steps() == [1, 2, 2] and len(w.detections) == 1


def test_the_watch_concern_follows_the_workdir_and_checkpoint_dir_by_default_never_the_state_dir(tmp_path: Path) -> None:
    from supervisor.config.model import config_from_table
    from supervisor.daemon.watchconcern import metric_files_monitor

    wd, ck = tmp_path / "wd", tmp_path / "ck"
    ck.mkdir()
    (wd / "sd").mkdir(parents=True)
    cfg = config_from_table({"job": {"command": ["true"], "workdir": str(wd), "watch_files": ["logs/*"]},
                             "checkpoints": {"dir": str(ck)}})
    assert cfg.detectors.metric_files is True
    w = Watch([])
    mf = metric_files_monitor(cfg, wd / "sd", w.lw)
    assert mf.roots == (str(wd.resolve()), str(ck.resolve())) and mf.globs == (str(wd / "logs/*"),)
    mf.baseline()
    (wd / "sd" / "metrics-rank0.jsonl").write_text(json.dumps({"step": 3, "loss": 1.0}) + "\n")  # the client's
    (ck / "metrics.jsonl").write_text(json.dumps({"step": 4, "loss": 1.0}) + "\n")
    mf.scan_now()
    assert mf.status()["files"] == {str(ck.resolve() / "metrics.jsonl"): {"kind": "jsonl", "records": 1, "last_step": 4}}
    off = config_from_table({"job": {"command": ["true"]}, "detectors": {"metric_files": False}})
    assert metric_files_monitor(off, tmp_path / "sd", w.lw).roots == ()


def test_a_checkpoint_dir_found_while_running_is_searched_too(tmp_path: Path) -> None:
    # The checkpoint-dir discovery (or a reload) swaps the daemon's config; the watch concern's
    # tick gives its dir to the metric files (HF logs into output_dir/runs/ beside checkpoint-N/).
    from dataclasses import replace

    from supervisor.config.model import config_from_table
    from supervisor.core.machine import State
    from supervisor.core.messages import Resume
    from supervisor.daemon.plugin import RunView, Tick
    from supervisor.daemon.watchconcern import WatchPlugin, metric_files_monitor

    wd, out = tmp_path / "wd", tmp_path / "out"
    wd.mkdir()
    out.mkdir()
    cfg = config_from_table({"job": {"command": ["true"], "workdir": str(wd)}})
    w = Watch([])
    concern = WatchPlugin()
    concern.logwatch = w.lw
    concern.metric_files = metric_files_monitor(cfg, tmp_path / "sd", w.lw)
    run = RunView(cfg, "run-1", tmp_path / "sd", State.RUNNING, 0, True, None, None, Resume(None, None, "fresh"),
                  None, None, "", now=1.0, wall=0.0)
    concern.metric_files.baseline()
    concern.tick(Tick(1.0), run)
    assert concern.metric_files.roots == (str(wd.resolve()),)
    found = config_from_table({"job": {"command": ["true"], "workdir": str(wd)}, "checkpoints": {"dir": str(out)}})
    concern.tick(Tick(2.0), replace(run, cfg=found))
    assert concern.metric_files.roots == (str(wd.resolve()), str(out.resolve()))
    (out / "runs").mkdir()
    shutil.copy(CORPUS / "hf_tb.tfevents", out / "runs" / TB)
    concern.metric_files.scan_now()
    assert w.steps() == list(range(2, MANIFEST["hf"]["max_steps"] + 1, MANIFEST["hf"]["logging_steps"]))


def test_a_followed_file_is_read_when_written_not_at_the_next_search(tmp_path: Path) -> None:
    # The tree is searched every 30 s here; a write to a file already followed wakes the reader
    # (inotify on its directory), so the NaN is judged long before the next search.
    w = Watch([tmp_path], poll_interval_s=30)
    w.mf.baseline()
    m = tmp_path / "out" / "metrics.jsonl"
    m.parent.mkdir()
    m.write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n")
    w.mf.start()
    try:
        wait_for(lambda: w.steps() == [1], timeout=10, what="the first pass")
        t0 = time.monotonic()
        with open(m, "a") as f:
            f.write(json.dumps({"step": 2, "loss": math.nan}) + "\n")
        wait_for(lambda: w.detections, timeout=10, what="the NaN, read on the write's wake-up")
        assert time.monotonic() - t0 < 10 and w.mf.scans == 2  # the baseline's and the first pass's
    finally:
        w.mf.stop()
    assert w.detections[0].step == 2
