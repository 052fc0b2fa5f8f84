"""The "hang detection is off" notice (output_liveness_off) goes out only while no progress
signal has been seen at all, and is taken back once steps appear (metric files included)."""
from __future__ import annotations

import time
from pathlib import Path

from structlog.testing import capture_logs

from supervisor.core.observations import Detection, MetricRecord
from supervisor.watch.config import DetectorsConfig, HeartbeatConfig
from supervisor.watch.heartbeat import HeartbeatMonitor
from supervisor.watch.logwatch import LogWatcher
from tests.watch.test_heartbeat import Clock, ctx_for


def watched(tmp_path: Path) -> tuple[Clock, HeartbeatMonitor, LogWatcher, list[Detection]]:
    clock, out = Clock(), list[Detection]()
    m = HeartbeatMonitor(HeartbeatConfig(check_interval_s=0.01), wall=clock.wall)
    m.start(ctx_for(tmp_path / "hb", clock.mono), out.append)
    w = LogWatcher(DetectorsConfig(), out.append, lambda r: None, progress=m, clock=lambda: clock.mono)
    return clock, m, w, out


def test_no_step_anywhere_gives_the_notice_once_and_a_step_takes_it_back(tmp_path: Path) -> None:
    clock, m, w, out = watched(tmp_path)
    with capture_logs() as logs:
        w.feed("stdout", ["Epoch 0: loading data", "nothing we can parse"])
        m.poll(clock.advance(61.0))
        m.poll(clock.advance(5.0))
        assert [e["event"] for e in logs].count("output_liveness_off") == 1
        w.feed_records("file:metrics.csv", [MetricRecord(step=10, loss=2.0, fmt="csv", at=time.time())])
        m.poll(clock.advance(1.0))
    names = [e["event"] for e in logs]
    assert names.count("output_liveness_on") == 1 and not out


def test_a_metric_file_step_before_the_notice_means_no_notice(tmp_path: Path) -> None:
    clock, m, w, _ = watched(tmp_path)
    with capture_logs() as logs:
        w.feed("stdout", ["nothing we can parse"])
        w.feed_records("file:metrics.csv", [MetricRecord(step=1, loss=2.0, fmt="csv", at=time.time())])
        m.poll(clock.advance(61.0))
    assert "output_liveness_off" not in [e["event"] for e in logs]
