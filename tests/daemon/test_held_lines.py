"""The first job is spawned before the log watcher is built (issue 25 build 1): what it prints
meanwhile is held and reaches the real detectors, in order, once the watcher is attached."""
from __future__ import annotations

import time
import threading
from pathlib import Path

import pytest

from supervisor.daemon.watchconcern import HeldLines
from supervisor.core.observations import Detection, MetricRecord
from supervisor.watch.config import DetectorsConfig
from supervisor.watch.logwatch import LogWatcher


def _watcher() -> tuple[LogWatcher, list[MetricRecord], list[Detection]]:
    metrics: list[MetricRecord] = []
    found: list[Detection] = []
    w = LogWatcher(DetectorsConfig(), found.append, metrics.append)
    w.reset(0, None)
    return w, metrics, found


def test_lines_before_the_watcher_exists_reach_its_detectors_in_order() -> None:
    held = HeldLines()
    held.feed("stdout", ["iter 1: loss 2.5000, time 10.00ms", "iter 2: loss 2.4000, time 10.00ms"])
    held.feed_records("file:metrics.csv", [MetricRecord(step=3, loss=2.3, fmt="csv", at=time.time())])
    held.feed("stderr", ["iter 4: loss nan, time 10.00ms"])
    w, metrics, found = _watcher()
    held.attach(w)
    held.feed("stdout", ["iter 5: loss 2.2000, time 10.00ms"])
    assert [m.step for m in metrics][:3] == [1, 2, 3]
    assert [d.cause.value for d in found] == ["nan"], found


def test_a_pump_feeding_while_the_watcher_is_attached_loses_and_reorders_nothing() -> None:
    held = HeldLines()
    n = 3000
    started = threading.Event()

    def pump() -> None:
        for i in range(1, n + 1):
            held.feed("stdout", [f"iter {i}: loss 2.0000, time 10.00ms"])
            if i == 100:
                started.set()

    t = threading.Thread(target=pump)
    t.start()
    assert started.wait(30)
    w, metrics, found = _watcher()
    held.attach(w)  # while the pump is (most likely) still feeding
    t.join(60)
    assert [m.step for m in metrics] == list(range(1, n + 1)) and not found


def test_lines_are_dropped_not_kept_once_the_watcher_cannot_be_built() -> None:
    held = HeldLines()
    held.feed("stdout", ["iter 1: loss 2.5000, time 10.00ms"])
    held.drop()
    held.feed("stdout", ["iter 2: loss 2.5000, time 10.00ms"])
    w, metrics, _ = _watcher()
    held.attach(w)  # nothing held to hand over: job.log keeps the lines, memory does not
    assert metrics == []


def test_a_log_watcher_that_cannot_be_built_is_said_and_the_daemon_supervises_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The one failure injected: the log watcher's constructor raises (a bug of ours after the spawn).
    from supervisor.watch import logwatch

    from ..fakes import daemon

    def broken(*_a: object, **_k: object) -> None:
        raise RuntimeError("broken watcher")

    monkeypatch.setattr(logwatch.LogWatcher, "__init__", broken)
    d = daemon(tmp_path)
    assert d.runner.job is not None, "the job was launched all the same"
    failed = [e for e in d.ledger.events if e["event"] == "monitor_failed"]
    assert failed and "broken watcher" in failed[0]["message"] and d.watch.logwatch is None
    d.watch.lines.feed("stdout", ["iter 1: loss nan, time 10.00ms"])  # nothing takes it, nothing is kept
    d.step()
    assert d.runner.job is not None and "failure_detected" not in d.events()
