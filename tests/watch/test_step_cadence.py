"""Hangs at sparse cadences (supervisor/watch/liveness.py): a job that logs every N steps is judged on
its own rhythm after a few intervals, provisional with twice the margin before that, timed from its
first logged step before any interval; a noisy rhythm, an evaluation, a save and a file read in
bursts are no hang; ``status`` says which timeout is in force and where it came from."""
from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

from supervisor.cli.render import status_table
from supervisor.events import Cause
from supervisor.core.observations import Detection, MetricRecord
from supervisor.watch.config import DetectorsConfig, HeartbeatConfig
from supervisor.watch.heartbeat import HeartbeatMonitor
from supervisor.watch.liveness import OutputLiveness
from supervisor.watch.logwatch import LogWatcher
from tests.watch.test_heartbeat import Clock, ctx_for

DEFAULTS = HeartbeatConfig()  # the daemon's: floor 60 s, factor 5, initial 900 s, 3 step intervals


def test_the_defaults_a_sparse_logger_is_judged_after_a_few_intervals() -> None:
    assert DEFAULTS.step_learn_after == 3 and DEFAULTS.learn_after == 20  # heartbeats keep 20
    live = OutputLiveness(DEFAULTS)
    live.start(0.0)
    live.line(1.0, "GPU available: False")
    live.step(20.0, 0)  # a step 0 printed at once says nothing about the rhythm
    assert live.timeout() == (900.0, "initial") and "initial" in live.basis()
    live.step(40.0, 50)
    # One interval: provisional, twice the margin: max(60, 20 x 5 x 2).
    assert live.timeout() == (200.0, "learned") and live.basis().startswith("provisional from 1 interval")
    live.step(52.0, 100)
    assert live.timeout() == (200.0, "learned")  # the longest gap (20 s) x 5 x 2, until 3 intervals
    live.step(64.0, 150)
    assert live.timeout() == (100.0, "learned") and live.basis().startswith("learned from 3 intervals")
    live.step(76.0, 200)
    assert live.check(176.0) is None
    s = live.check(176.5)
    assert s is not None and s.kind == "steps" and s.last_step == 200


def test_the_first_logged_step_times_the_rhythm_before_any_interval() -> None:
    # Lightning at its defaults: the first scalar at step 49, nothing before a hang at step 60.
    live = OutputLiveness(DEFAULTS)
    live.start(0.0)
    live.line(25.0, "  | Name | Type | Params")  # the last start-up line: imports and set-up took 25 s
    live.step(31.0, 49, "metric file /x/events.out.tfevents.1")
    assert live.timeout() == (60.0, "learned")  # max(60, 6 s x 5 x 2): the floor
    assert "first step (49, 6.0 s after the start-up in the metric file /x/events" in live.basis()
    assert live.check(91.0) is None
    s = live.check(91.5)
    assert s is not None and s.timeout_source == "learned" and s.last_step == 49
    # Without a start-up line the launch counts (longer, never shorter); never above the initial 900 s.
    slow = OutputLiveness(DEFAULTS)
    slow.start(0.0)
    slow.step(300.0, 49)
    assert slow.timeout() == (900.0, "learned")
    # A first step printed as a line is not timed from its own line but from the lines before it.
    printed = OutputLiveness(DEFAULTS)
    printed.start(0.0)
    printed.line(5.0, "model loaded")
    printed.line(35.0, "step 50 | loss 2.0")
    printed.step(35.0, 50, "output (stdout)")
    assert printed.first is not None and printed.first[0] == 30.0 and printed.timeout() == (300.0, "learned")
    # A resumed attempt times the steps since its resume step only.
    resumed = OutputLiveness(DEFAULTS)
    resumed.start(0.0, start_step=45)
    resumed.step(10.0, 49)
    assert resumed.timeout() == (900.0, "initial")


def test_a_noisy_rhythm_is_allowed_for_by_its_margin() -> None:
    live = OutputLiveness(DEFAULTS)
    live.start(0.0)
    t = 0.0
    for i, gap in enumerate((10.0, 31.0, 8.0, 25.0, 12.0, 30.0)):
        t += gap
        live.step(t, (i + 1) * 50)
    assert live.timeout() == (155.0, "learned")  # 31 s x 5
    assert live.check(t + 3 * 31.0) is None  # three times the slowest interval seen: still no hang


def test_a_file_read_in_bursts_adds_its_delay() -> None:
    # A SummaryWriter that flushes every 120 s: steps written every 2 s arrive in bursts up to 2 min
    # after they were written. The silence since the newest step written is then up to 2 min long.
    clock = Clock()
    m = HeartbeatMonitor(HeartbeatConfig(check_interval_s=0.01), wall=clock.wall)
    out: list[Detection] = []
    m.start(ctx_for(Path("/nonexistent/hb"), clock.mono), out.append)
    w = LogWatcher(DetectorsConfig(), out.append, lambda r: None, progress=m, clock=lambda: clock.mono)
    src = "tb:/run/events.out.tfevents.1"
    step = 0
    for _ in range(4):  # four flushes, 120 s apart, each with the 60 steps written since the last
        now = time.time()  # the reader's records carry the writer's wall time
        recs = [MetricRecord(step=step + i, loss=2.0, fmt="tb", source=src, at=now - 120.0 + 2.0 * i)
                for i in range(1, 61)]
        step += 60
        clock.advance(120.0)
        w.feed_records(src, recs)
        for _ in range(12):
            m.poll(clock.advance(9.9))  # the 119 s until the next flush
    assert out == [], out
    ht = m.timeout_in_force()
    assert ht["timeout_s"] is not None and float(ht["timeout_s"]) >= 60 + 118  # type: ignore[arg-type]
    assert "read late" in str(ht["timeout_from"]) and "metric file /run/events" in str(ht["timeout_from"])


def test_a_silent_save_under_a_provisional_timeout_is_activity_not_a_hang(tmp_path: Path) -> None:
    clock, out = Clock(), list[Detection]()
    ck = tmp_path / "ckpt"
    ck.mkdir()
    cfg = HeartbeatConfig(check_interval_s=0.01, learn_floor_s=5.0)
    m = HeartbeatMonitor(cfg, wall=clock.wall)
    m.start(replace(ctx_for(tmp_path / "hb", clock.mono), checkpoint_dir=ck), out.append)
    m.note_output(clock.advance(1.0), "start-up done")
    for s in (10, 20):  # one interval of 0.5 s: provisional, max(5, 0.5 x 5 x 2) = 5 s
        m.note_step(clock.advance(0.5), s)
    assert m.timeout_in_force()["timeout_s"] == 5.0
    shard = ck / "model.bin.tmp"
    for _ in range(8):  # a 16 s save that prints nothing, a chunk every 2 s
        m.poll(clock.advance(2.0))
        shard.write_bytes(b"x")
        os.utime(shard, (clock.wall(), clock.wall()))
    assert out == []
    m.poll(clock.advance(6.0))  # the save is over and nothing follows: hung
    assert [d.cause for d in out] == [Cause.HANG]


def test_status_says_which_timeout_judges_the_job_and_where_it_came_from(tmp_path: Path) -> None:
    clock, out = Clock(), list[Detection]()
    m = HeartbeatMonitor(HeartbeatConfig(check_interval_s=0.01), wall=clock.wall)
    m.start(ctx_for(tmp_path / "hb", clock.mono), out.append)
    w = LogWatcher(DetectorsConfig(), out.append, lambda r: None, progress=m, clock=lambda: clock.mono)
    w.feed("stdout", ["loading model"])
    m.poll(clock.advance(1.0))
    assert m.timeout_in_force()["signal"] == "none" and "off" in str(m.timeout_in_force()["timeout_from"])
    for s in range(0, 200, 50):
        w.feed("stdout", [f"step {s} | loss 2.0"])
        m.poll(clock.advance(10.0))
    ht = m.timeout_in_force()
    assert ht["signal"] == "steps" and ht["timeout_source"] == "learned" and ht["timeout_s"] == 60.0
    assert ht["timeout_from"] == "learned from 3 intervals of the output (stdout), longest 10.0 s", ht
    table = status_table({"state": "running", "hang_timeout": ht})
    assert "hang timeout  60 s (steps, silent 10.0s): learned from 3 intervals of the output (stdout)" in table
    m.start(ctx_for(tmp_path / "hb", clock.mono, attempt=1), out.append)  # a relaunch, before its first step
    ht = m.timeout_in_force()
    assert ht["timeout_s"] == 1800.0 and ht["timeout_source"] == "startup", ht
    assert str(ht["timeout_from"]).startswith("start-up ([heartbeat] startup_timeout_s) until this attempt's first "
                                              "step; then learned from 3 intervals"), ht
    cfgd = HeartbeatMonitor(HeartbeatConfig(timeout_s=30), wall=clock.wall)
    assert cfgd.timeout_in_force()["timeout_from"] == "configured ([heartbeat] timeout_s)"
