"""The places a quiet job's metrics are found with no config (issue 35): text logs it writes
(``*.log``, ``*.txt``; loguru's JSON lines too), MLflow's file store below ``mlruns/`` (keys with
``/`` deeper than the walk's depth), and never the supervisor's own output read back as the job's."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

from supervisor.watch.metricfiles import MetricFiles
from tests.watch.test_metricfiles import Watch


def _pass(w: Watch) -> None:
    while w.mf.scan_now():
        pass


def test_a_text_log_written_during_the_run_is_read_with_the_line_parsers(tmp_path: Path) -> None:
    w = Watch([tmp_path])
    w.mf.baseline()
    out = tmp_path / "out"
    out.mkdir()
    lines = ["2026-12-07 15:00:00,001 INFO train: starting\n",
             "2026-12-07 15:00:01,001 INFO train: step 10 loss=2.5 lr=0.05\n",
             json.dumps({"record": {"message": "step 11 loss=nan"}, "text": "x"}) + "\n",
             "a long line of prose about a boss and a loss of nothing " * 3 + "\n"]
    (out / "train.log").write_text("".join(lines))
    _pass(w)
    recs = [r for r in w.records if r.source == f"log:{out / 'train.log'}"]
    assert [r.step for r in recs] == [10, 11] and recs[0].loss == 2.5 and math.isnan(recs[1].loss or 0.0)
    assert w.detections and w.detections[0].cause.value == "nan"
    assert str(out / "train.log") in w.mf.status()["files"]  # type: ignore[operator]


def test_mlflow_file_store_keys_below_the_walk_s_depth_are_read(tmp_path: Path) -> None:
    w = Watch([tmp_path], depth=2)
    w.mf.baseline()
    metrics = tmp_path / "mlruns" / "0" / "0123abcd" / "metrics"
    (metrics / "train").mkdir(parents=True)
    (metrics / "train" / "loss").write_text("1796655624679 1.0 0\n1796655624686 nan 1\n")
    (metrics / "lr").write_text("1796655624679 0.1 0\n")
    _pass(w)
    recs = [r for r in w.records if r.source.startswith("mlflow:")]
    assert [r.step for r in recs] == [0, 1] and math.isnan(recs[1].loss or 0.0), recs


def test_the_supervisor_s_own_output_and_tailed_logs_are_never_read_back(tmp_path: Path) -> None:
    console = tmp_path / "console.log"  # `transformer-supervisor wrap ... > console.log`: the job's lines again
    console.write_text("")
    twin = tmp_path / "twin.log"
    os.link(console, twin)  # the same file under another name: excluded by identity, not by name
    tailed = tmp_path / "rank0.log"  # named in [job] watch_files: the line tailer's
    w = Watch([tmp_path], own_files=[console], globs=[str(tmp_path / "rank*.log")])
    w.mf.baseline()
    for p in (console, tailed):
        with open(p, "a") as fh:
            fh.write("step 5 loss=nan\n")
    _pass(w)
    assert not w.records and not w.detections


def test_a_huge_text_log_without_newlines_is_read_in_bounded_pieces(tmp_path: Path) -> None:
    w = Watch([tmp_path])
    w.mf.baseline()
    big = tmp_path / "noise.txt"
    with open(big, "wb") as fh:
        fh.truncate(300 << 20)  # a 300 MB sparse file: no newline anywhere
    with open(big, "ab") as fh:
        fh.write(b"\nstep 7 loss=nan\n")
    passes = 0
    while w.mf.scan_now():
        passes += 1
    assert passes >= 10  # 8 MiB a read: the backlog takes many passes, none holds it all
    assert [r.step for r in w.records] == [7]


def test_kinds() -> None:
    from supervisor.watch.metricfiles import kind_of

    assert kind_of("train.log") == "log" and kind_of("stdout.txt") == "log" and kind_of("mlflow.db") == "mlflow_db"
    assert kind_of("loss", os.path.join("w", "mlruns", "1", "r", "metrics", "loss")) == "mlflow"
    assert kind_of("weights.bin") is None
    assert callable(MetricFiles)  # the monitor these kinds feed
