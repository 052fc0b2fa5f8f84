"""Metric files the job writes (supervisor/watch/metricfiles.py): what following them costs the
daemon, and how long a NaN takes from the writer to a detection, per source.

- cost of following (the headline): the monitor's thread at its defaults (inotify wake, a search
  every 1 s) follows a file that a child process writes step by step, as a training job does
  (BENCH_FOLLOW_STEPS steps, 2 scalars a step, one step every BENCH_FOLLOW_PACE_S), through
  MetricFiles -> LogWatcher.feed_records (every detector on); this process's CPU time (the
  writers are children: their CPU is not in it) per 1,000 scalars and as a share of a core at
  that pace. The writers are the real ones: ``torch.utils.tensorboard.SummaryWriter`` (torch
  stays out of this process), Lightning's CSV writer (``save()`` after each log, as Lightning
  calls it), and JSON lines flushed per step. Each wake reads what a step added, so the cost per
  scalar depends on the pace: the row names it.
- beside: one pass over a finished file of many steps (CPU time of the read alone, per 1,000
  scalars: what catching up after a restart costs, not following), and the idle pass: walking a
  tree of directories that hold no metric file.
- detection delay: the writer writes a NaN into a file already followed (TensorBoard: a
  SummaryWriter child logging a step every 0.1 s, the delay measured from the scalar's own wall
  time; CSV and JSONL: appended here), the monitor's thread at its defaults (inotify wake, a
  search every 1 s); time until the NaN detection is emitted.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from supervisor.core.observations import Detection
from supervisor.watch.config import DetectorsConfig
from supervisor.watch.logwatch import LogWatcher
from supervisor.watch.metricfiles import MetricFiles
from supervisor.watch.tbevents import read_file

STEPS = 20_000  # 2 scalars a step (loss, lr): 40,000 scalars
FOLLOW_STEPS = int(os.environ.get("BENCH_FOLLOW_STEPS", "300"))
FOLLOW_PACE_S = float(os.environ.get("BENCH_FOLLOW_PACE_S", "0.1"))

# A job's own loggers, one step at a time: argv = kind, out dir, steps, pace.
STEP_WRITER = """
import json, sys, time
kind, out, steps, pace = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
if kind == "tb":
    from torch.utils.tensorboard import SummaryWriter
    w = SummaryWriter(out)
    log = lambda s: (w.add_scalar("train/loss", 1.0 / (s + 1), s), w.add_scalar("train/learning_rate", 1e-3, s))
elif kind == "csv":
    from lightning.fabric.loggers.csv_logs import _ExperimentWriter
    w = _ExperimentWriter(out)
    log = lambda s: (w.log_metrics({"train_loss": 1.0 / (s + 1), "lr": 1e-3}, s), w.save())
else:
    import os
    os.makedirs(out, exist_ok=True)
    fh = open(os.path.join(out, "metrics.jsonl"), "a")
    log = lambda s: (fh.write(json.dumps({"step": s, "loss": 1.0 / (s + 1), "lr": 1e-3}) + "\\n"), fh.flush())
print("ready", flush=True)
sys.stdin.readline()  # the monitor is following the folder by now
for s in range(steps):
    log(s)
    time.sleep(pace)
"""

TB_WRITER = """
import math, sys, time
from torch.utils.tensorboard import SummaryWriter
w = SummaryWriter(sys.argv[1])
steps, nan_at, pace = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
for step in range(steps):
    w.add_scalar("train/loss", math.nan if step == nan_at else 1.0 / (step + 1), step)
    w.add_scalar("train/learning_rate", 1e-3, step)
    if pace:
        time.sleep(pace)
w.close()
"""


def _watcher() -> tuple[LogWatcher, list[Detection], threading.Event]:
    got: list[Detection] = []
    ev = threading.Event()

    def emit(d: Detection) -> None:
        got.append(d)
        ev.set()

    return LogWatcher(DetectorsConfig(), emit, lambda r: None), got, ev


def _tb_file(d: Path, steps: int, nan_at: int = -1, pace: float = 0.0) -> subprocess.Popen:
    script = d / "tbw.py"
    script.write_text(TB_WRITER)
    return subprocess.Popen([sys.executable, str(script), str(d / "runs"), str(steps), str(nan_at), str(pace)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _records(lw: LogWatcher) -> int:
    n = lw.status()["metric_records"]
    assert isinstance(n, int), n
    return n


def _cost_of(root: Path, make: Callable[[], object], scalars: int) -> float:
    lw, _, _ = _watcher()
    mf = MetricFiles([root], lw)
    mf.baseline()
    make()
    for f in root.iterdir():
        os.utime(f)  # a hard link keeps the writer's mtime: written "before the run" would make it history
    t0 = time.process_time()
    while mf.scan_now():
        pass
    cpu = time.process_time() - t0
    recs = _records(lw)
    assert recs >= scalars // 2 - 1, f"read {recs} records of {scalars // 2} steps"
    return cpu / scalars * 1000


def follow_cost() -> list[dict]:
    """The monitor's own thread follows a file a child writes step by step; this process's CPU
    over the whole follow (the writer's start-up excluded: the clock starts once it is ready)."""
    rows = []
    scalars = 2 * FOLLOW_STEPS
    for kind, label in (("tb", "TensorBoard event file (SummaryWriter)"), ("csv", "Lightning CSVLogger metrics.csv "
                        "(save() after each log)"), ("jsonl", "JSONL (flushed per step)")):
        with tempfile.TemporaryDirectory() as d:
            root = Path(d)
            script = root / "stepw.py"
            script.write_text(STEP_WRITER)
            w = subprocess.Popen([sys.executable, str(script), kind, str(root / "out"), str(FOLLOW_STEPS),
                                  str(FOLLOW_PACE_S)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True)
            assert w.stdout is not None and w.stdin is not None
            assert w.stdout.readline().strip() == "ready", f"{kind} writer did not start"
            lw, _, _ = _watcher()
            mf = MetricFiles([root], lw)
            mf.start()
            try:
                t0, c0 = time.monotonic(), time.process_time()
                w.stdin.write("go\n")
                w.stdin.flush()
                assert w.wait(FOLLOW_STEPS * FOLLOW_PACE_S * 10 + 120) == 0, f"{kind} writer failed"
                deadline = time.monotonic() + 30
                while _records(lw) < FOLLOW_STEPS - 1:  # the last writes reach the monitor
                    assert time.monotonic() < deadline, f"{kind}: followed {_records(lw)} of {FOLLOW_STEPS} steps"
                    time.sleep(0.05)
                cpu, wall = time.process_time() - c0, time.monotonic() - t0
            finally:
                mf.stop()
        rows.append({"id": f"metricfiles-follow-{kind}", "name": f"following a growing file: daemon CPU per 1,000 "
                     f"scalars, {label}, written step by step by a child ({FOLLOW_STEPS} steps, 2 scalars a step, a "
                     f"step every {FOLLOW_PACE_S:g} s; the monitor at its defaults: inotify wake, a search every 1 s)",
                     "value": round(cpu / scalars * 1e6, 1), "unit": "ms", "target": "report"})
        rows.append({"id": f"metricfiles-follow-{kind}-core", "name": f"same, {kind}: as a share of one core at that "
                     f"pace ({scalars / wall:.0f} scalars/s)", "value": round(cpu / wall * 100, 2),
                     "unit": "% of a core", "target": "report"})
    return rows


def cost() -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "tb"
        root.mkdir()
        staging = Path(d) / "staging"
        staging.mkdir()
        assert _tb_file(staging, STEPS).wait(300) == 0
        [src] = (staging / "runs").glob("events.out.tfevents.*")
        scalars = len(read_file(str(src))[0])
        per = _cost_of(root, lambda: os.link(src, root / src.name), scalars)
        rows.append({"name": f"beside: a finished file read in one pass (catching up, not following): daemon CPU per "
                             f"1,000 scalars, TensorBoard event file (SummaryWriter, {scalars} scalars, 2 a step)", "value": round(per * 1000, 2),
                     "unit": "ms", "target": "report"})
        from lightning.fabric.loggers.csv_logs import _ExperimentWriter

        root = Path(d) / "csv"
        root.mkdir()
        w = _ExperimentWriter(str(staging / "csvlog"))
        for step in range(STEPS):
            w.log_metrics({"train_loss": 1.0 / (step + 1), "lr": 1e-3}, step)
        w.save()
        csv_src = staging / "csvlog" / "metrics.csv"
        per = _cost_of(root, lambda: os.link(csv_src, root / "metrics.csv"), 2 * STEPS)
        rows.append({"name": f"beside: a finished file in one pass: daemon CPU per 1,000 scalars, Lightning CSVLogger metrics.csv "
                             f"({2 * STEPS} values, 2 a row)", "value": round(per * 1000, 2), "unit": "ms",
                     "target": "report"})
        root = Path(d) / "jsonl"
        root.mkdir()
        jl = staging / "m.jsonl"
        jl.write_text("".join(json.dumps({"step": s, "loss": 1.0 / (s + 1), "lr": 1e-3}) + "\n" for s in range(STEPS)))
        per = _cost_of(root, lambda: os.link(jl, root / "metrics.jsonl"), 2 * STEPS)
        rows.append({"name": f"beside: a finished file in one pass: daemon CPU per 1,000 scalars, JSONL ({2 * STEPS} values, 2 a line)",
                     "value": round(per * 1000, 2), "unit": "ms", "target": "report"})
        tree = Path(d) / "tree"
        for i in range(500):
            (tree / f"d{i // 25}" / f"e{i}").mkdir(parents=True)
            (tree / f"d{i // 25}" / f"e{i}" / "data.bin").write_bytes(b"x")
        lw, _, _ = _watcher()
        mf = MetricFiles([tree], lw)
        mf.baseline()
        t0 = time.process_time()
        for _ in range(20):
            mf.scan_now()
        rows.append({"name": "following files: daemon CPU of one idle pass (the 1 s poll) over a working dir of "
                             "520 directories", "value": round((time.process_time() - t0) / 20 * 1000, 2),
                     "unit": "ms", "target": "report"})
    return rows


def delay(trials: int = 5) -> list[dict]:
    out: dict[str, list[float]] = {"tb": [], "csv": [], "jsonl": []}
    for i in range(trials):
        for kind in out:
            with tempfile.TemporaryDirectory() as d:
                root = Path(d)
                lw, got, ev = _watcher()
                mf = MetricFiles([root], lw)
                mf.start()
                try:
                    if kind == "tb":
                        p = _tb_file(root, 60, nan_at=40, pace=0.1)
                        if not ev.wait(60):
                            raise RuntimeError("no TensorBoard NaN detection within 60 s")
                        seen = time.time()
                        p.wait(60)
                        [f] = (root / "runs").glob("events.out.tfevents.*")
                        wrote = min(s.wall_time for s in read_file(str(f))[0] if math.isnan(s.value))
                    else:
                        name = "metrics.csv" if kind == "csv" else "metrics.jsonl"
                        with open(root / name, "w") as fh:
                            if kind == "csv":
                                fh.write("epoch,step,train_loss\n")
                            for step in range(5):
                                fh.write(f"0,{step},{1.0 / (step + 1)}\n" if kind == "csv"
                                         else json.dumps({"step": step, "loss": 1.0}) + "\n")
                            fh.flush()
                            deadline = time.monotonic() + 10
                            while _records(lw) < 5:  # followed: found by a search
                                if time.monotonic() > deadline:
                                    raise RuntimeError(f"{kind} file not followed within 10 s")
                                time.sleep(0.01)
                            time.sleep(0.17 * i)  # a phase against the poll
                            fh.write("0,5,nan\n" if kind == "csv" else '{"step": 5, "loss": NaN}\n')
                            fh.flush()
                            wrote = time.time()
                        if not ev.wait(10):
                            raise RuntimeError(f"no {kind} NaN detection within 10 s")
                        seen = time.time()
                    out[kind].append(seen - wrote)
                finally:
                    mf.stop()
    rows = []
    for kind, label in (("tb", "TensorBoard (SummaryWriter, a step every 0.1 s)"), ("csv", "CSV"), ("jsonl", "JSONL")):
        xs = sorted(out[kind])
        rows.append({"name": f"detection delay, NaN written to a followed file -> detected, {label}, median / max "
                             f"of {trials} (inotify wake; the search for new files: every 1 s)",
                     "value": f"{xs[len(xs) // 2] * 1000:.0f} / {xs[-1] * 1000:.0f}", "unit": "ms",
                     "target": "<= 1000"})
    return rows


def run() -> list[dict]:
    return follow_cost() + cost() + delay()


if __name__ == "__main__":
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    for r in run():
        print(r)
