"""Liveness without the client: learned cadences, output/step silence, through the heartbeat monitor."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from supervisor.events import Cause
from supervisor.core.observations import Detection
from supervisor.watch.config import DetectorsConfig, HeartbeatConfig
from supervisor.watch.heartbeat import HeartbeatMonitor
from supervisor.watch.liveness import Cadence, OutputLiveness
from supervisor.watch.logwatch import LogWatcher
from tests.watch.test_heartbeat import Clock, ctx_for, write_hb

LEARN: dict[str, Any] = dict(learn_after=3, learn_factor=2.0, learn_floor_s=5.0, initial_timeout_s=100.0, startup_timeout_s=50.0)


def test_cadence_initial_then_learned_and_config_wins() -> None:
    c = Cadence(HeartbeatConfig(**LEARN))
    assert c.timeout() == (100.0, "initial")
    for gap in (1.0, 4.0, 2.0):
        c.add(gap)
    assert c.timeout() == (8.0, "learned")  # max(5 floor, 4 x 2)
    c.add(0.0)  # a zero gap (two records in one read) is not an interval
    assert c.intervals == 3
    small = Cadence(HeartbeatConfig(**LEARN))
    for gap in (0.1, 0.2, 0.1):
        small.add(gap)
    assert small.timeout() == (5.0, "learned")  # the floor
    assert Cadence(HeartbeatConfig(timeout_s=7, **LEARN)).timeout() == (7, "config")


def steps(live: OutputLiveness, t: float, first: int, n: int, gap: float) -> float:
    for i in range(n):
        t += gap
        live.line(t, f"iter {first + i}: loss 2.0")
        live.step(t, first + i)
    return t


def test_silence_after_learned_steps_is_a_hang_with_its_evidence() -> None:
    live = OutputLiveness(HeartbeatConfig(**LEARN))
    live.start(0.0)
    t = steps(live, 0.0, 1, 5, 1.0)
    assert live.signal == "steps" and live.timeout() == (5.0, "learned")
    assert live.check(t + 5.0) is None
    s = live.check(t + 5.1)
    assert s is not None and s.kind == "steps" and s.last_step == 5 and s.last_line == "iter 5: loss 2.0"
    assert s.timeout_source == "learned" and "last step 5" in s.summary()


def test_any_line_resets_the_clock_but_learning_uses_step_gaps() -> None:
    live = OutputLiveness(HeartbeatConfig(**LEARN))
    live.start(0.0)
    t = steps(live, 0.0, 1, 4, 1.0)
    for _ in range(10):  # an evaluation that prints a bar: 30 s without a new step
        t += 3.0
        live.line(t, " 40%|####      | 4/10 [00:01<00:01]")
        assert live.check(t) is None
    t = steps(live, t, 5, 1, 1.0)  # the 31 s pause is now a seen interval
    assert live.timeout() == (62.0, "learned")
    assert live.check(t + 60) is None  # the next, silent evaluation of that length is allowed for


def test_startup_of_each_attempt_has_its_own_allowance() -> None:
    live = OutputLiveness(HeartbeatConfig(**LEARN))
    live.start(0.0)
    steps(live, 0.0, 1, 5, 1.0)
    live.start(1000.0)  # a relaunch: loading the model takes far longer than a step
    live.line(1001.0, "loading checkpoint shards")
    assert live.check(1040.0) is None
    s = live.check(1051.0)
    assert s is not None and s.kind == "startup" and s.timeout_source == "startup"


def test_a_job_without_parsed_steps_is_judged_only_with_an_explicit_timeout() -> None:
    live = OutputLiveness(HeartbeatConfig(**LEARN))
    live.start(0.0)
    for i in range(50):  # a chatty start-up, then silent training (logs only to wandb)
        live.line(i * 0.01, f"loading {i}")
    assert live.signal == "none" and live.check(10_000.0) is None
    timed = OutputLiveness(HeartbeatConfig(timeout_s=15, **LEARN))
    timed.start(0.0)
    assert timed.check(1000.0) is None  # it never printed: nothing to judge yet
    timed.line(1.0, "epoch 1 started")
    assert timed.check(16.0) is None
    s = timed.check(16.1)
    assert s is not None and s.kind == "output" and s.timeout_s == 15 and s.last_line == "epoch 1 started"


def monitor(cfg: HeartbeatConfig, clock: Clock, hb: Path, out: list[Detection]) -> HeartbeatMonitor:
    m = HeartbeatMonitor(cfg, wall=clock.wall)
    m.start(ctx_for(hb, clock.mono), out.append)
    return m


def test_unmodified_job_hang_detected_through_the_logwatcher(tmp_path: Path) -> None:
    clock, out = Clock(), list[Detection]()
    m = monitor(HeartbeatConfig(check_interval_s=0.01, **LEARN), clock, tmp_path / "hb", out)
    w = LogWatcher(DetectorsConfig(), out.append, lambda r: None, progress=m, clock=lambda: clock.mono)
    for i in range(6):
        w.feed("stdout", [f"iter {i * 10}: loss {3 - i / 10:.4f}, time 12.00ms, mfu 1.00%"])
        m.poll(clock.advance(1.0))
    w.feed("stdout", ["iter 50: loss 2.5000, time 12.00ms, mfu 1.00%", "saving checkpoint to out"])
    m.poll(clock.advance(5.0))
    assert out == []
    m.poll(clock.advance(0.1))  # 5.1 s silent > learned 5 s
    assert [d.cause for d in out] == [Cause.HANG]
    d = out[0]
    assert d.source == "output" and d.step == 50 and d.details["kind"] == "output_silence"
    assert "saving checkpoint to out" in (d.evidence or "")
    assert m.status()["output_liveness"]["signal"] == "steps"  # type: ignore[index]


def test_heartbeats_take_precedence_over_output(tmp_path: Path) -> None:
    clock, out = Clock(), list[Detection]()
    hb = tmp_path / "hb"
    m = monitor(HeartbeatConfig(check_interval_s=0.01, timeout_s=30, **{k: v for k, v in LEARN.items()}),
                clock, hb, out)
    w = LogWatcher(DetectorsConfig(), out.append, lambda r: None, progress=m, clock=lambda: clock.mono)
    for i in range(5):
        w.feed("stdout", [f"iter {i}: loss 2.0"])
        write_hb(hb, 0, clock.wall(), seq=i + 1, step=i)
        m.poll(clock.advance(1.0))
    for i in range(20):  # the job stops printing but its heartbeats flow: it is alive
        write_hb(hb, 0, clock.wall(), seq=10 + i, step=5 + i)
        m.poll(clock.advance(2.0))
    assert out == [] and m.status()["output_liveness"] is None


def test_output_liveness_can_be_turned_off(tmp_path: Path) -> None:
    clock, out = Clock(), list[Detection]()
    m = monitor(HeartbeatConfig(check_interval_s=0.01, output_liveness=False, **LEARN), clock, tmp_path / "hb", out)
    for i in range(6):
        m.note_output(clock.mono, f"iter {i}: loss 2.0")
        m.note_step(clock.mono, i)
        m.poll(clock.advance(1.0))
    m.poll(clock.advance(1000.0))
    assert out == []


def test_a_learned_hang_teaches_the_next_attempt() -> None:
    live = OutputLiveness(HeartbeatConfig(**LEARN))
    live.start(0.0)
    t = steps(live, 0.0, 1, 5, 1.0)
    s = live.check(t + 6.0)  # a first, silent evaluation of 6 s: mistaken for a hang once
    assert s is not None and s.timeout_source == "learned"
    live.fired(s)
    live.start(100.0)
    t = steps(live, 100.0, 1, 2, 1.0)
    assert live.timeout() == (12.0, "learned") and live.check(t + 6.5) is None


def test_checkpoint_files_being_written_count_as_activity(tmp_path: Path) -> None:
    import os

    clock, out = Clock(), list[Detection]()
    ck = tmp_path / "ckpt"
    (ck / "checkpoint-40").mkdir(parents=True)
    m = HeartbeatMonitor(HeartbeatConfig(check_interval_s=0.01, **LEARN), wall=clock.wall)
    ctx = ctx_for(tmp_path / "hb", clock.mono)
    from dataclasses import replace
    m.start(replace(ctx, checkpoint_dir=ck), out.append)
    for i in range(6):
        m.note_output(clock.mono, f"iter {i}: loss 2.0")
        m.note_step(clock.mono, i)
        m.poll(clock.advance(1.0))
    clock.advance(5.0)
    shard = ck / "checkpoint-40" / "model.safetensors"
    shard.write_bytes(b"x" * 10)
    for p in (shard, shard.parent, ck):  # written "now" on the injected wall clock
        os.utime(p, (clock.wall(), clock.wall()))
    m.poll(clock.advance(1.0))  # 7 s without a line, but the save was 1 s ago
    assert out == []
    m.poll(clock.advance(5.5))  # the save is over and nothing follows: hung
    assert [d.cause for d in out] == [Cause.HANG]


def test_the_supervisors_own_manifests_are_not_the_job_at_work(tmp_path: Path) -> None:
    import os
    from dataclasses import replace

    clock, out = Clock(), list[Detection]()
    ck = tmp_path / "ckpt"
    (ck / "checkpoint-40").mkdir(parents=True)
    m = HeartbeatMonitor(HeartbeatConfig(check_interval_s=0.01, **LEARN), wall=clock.wall)
    m.start(replace(ctx_for(tmp_path / "hb", clock.mono), checkpoint_dir=ck), out.append)
    for i in range(6):
        m.note_output(clock.mono, f"iter {i}: loss 2.0")
        m.note_step(clock.mono, i)
        m.poll(clock.advance(1.0))
    clock.advance(4.0)
    manifest = ck / "checkpoint-40.manifest.json"  # the background verification, not the job
    manifest.write_text("{}")
    for p in (manifest, ck, ck / "checkpoint-40"):
        os.utime(p, (clock.wall(), clock.wall()))
    m.poll(clock.advance(1.5))
    assert [d.cause for d in out] == [Cause.HANG]


def test_the_last_line_in_a_hang_detection_is_masked_and_bounded(tmp_path: Path) -> None:
    clock, out = Clock(), list[Detection]()
    m = monitor(HeartbeatConfig(check_interval_s=0.01, **LEARN), clock, tmp_path / "hb", out)
    w = LogWatcher(DetectorsConfig(), out.append, lambda r: None, progress=m, clock=lambda: clock.mono)
    for i in range(6):
        w.feed("stdout", [f"iter {i * 10}: loss {3 - i / 10:.4f}, time 12.00ms, mfu 1.00%"])
        m.poll(clock.advance(1.0))
    w.feed("stdout", ["connecting to postgres://u:pw-s3cr3t@h/db with --api-key=k-s3cr3t " + "x" * 5000])
    m.poll(clock.advance(5.1))
    assert [d.cause for d in out] == [Cause.HANG]
    last = str(out[0].details["last_line"])
    assert "s3cr3t" not in last and "s3cr3t" not in (out[0].evidence or "")
    assert "postgres://u:<redacted>@h/db" in last and len(last) < 300 and last.endswith("chars)")
