"""HeartbeatMonitor: fake clocks over real heartbeat files, then a real hanging child; py-spy dumps."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

import pytest

from supervisor.events import AttemptContext, Cause
from supervisor.core.observations import Detection
from supervisor.watch import stacks
from supervisor.watch.config import HeartbeatConfig
from supervisor.watch.heartbeat import HeartbeatMonitor, client_env
from tests.util import wait_for

REPO = Path(__file__).resolve().parents[2]
HELPERS = Path(__file__).resolve().parents[1] / "helpers"


class Clock:
    """Fake monotonic + wall clocks advancing together."""

    def __init__(self) -> None:
        self.mono = 1000.0
        self.wall_t = 1_700_000_000.0

    def advance(self, s: float) -> float:
        self.mono += s
        self.wall_t += s
        return self.mono

    def wall(self) -> float:
        return self.wall_t


def ctx_for(hb_dir: Path, started: float, attempt: int = 0, state_dir: Path | None = None) -> AttemptContext:
    return AttemptContext(run_id="r1", attempt=attempt, pgid=0, pid=0, started_monotonic=started,
                          state_dir=state_dir or hb_dir.parent, heartbeat_dir=hb_dir, checkpoint_dir=None,
                          resume_from=None, resume_step=None)


def write_hb(hb_dir: Path, rank: int, t: float, *, seq: int, step: int | None = None, state: str = "running",
             attempt: int = 0, world_size: int = 1) -> None:
    hb_dir.mkdir(parents=True, exist_ok=True)
    rec = {"v": 1, "rank": rank, "world_size": world_size, "pid": 1, "attempt": attempt, "step": step,
           "state": state, "t": t, "seq": seq}
    (hb_dir / f"heartbeat-rank{rank}.json").write_text(json.dumps(rec).ljust(255) + "\n")


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[Clock, Path, list[Detection]]]:
    yield Clock(), tmp_path / "hb", []


def monitor(cfg: HeartbeatConfig, clock: Clock, hb: Path, out: list[Detection], attempt: int = 0,
            mon: HeartbeatMonitor | None = None) -> HeartbeatMonitor:
    m = mon or HeartbeatMonitor(cfg, wall=clock.wall)
    m.start(ctx_for(hb, clock.mono, attempt), out.append)
    return m


FAST: dict[str, Any] = dict(check_interval_s=0.01)


def test_configured_timeout(setup: tuple[Clock, Path, list[Detection]]) -> None:
    clock, hb, out = setup
    m = monitor(HeartbeatConfig(timeout_s=10, **FAST), clock, hb, out)
    write_hb(hb, 0, clock.wall(), seq=1, step=5)
    m.poll(clock.advance(1))
    assert m.heartbeats() == {0: 1.0}
    m.poll(clock.advance(8))
    write_hb(hb, 0, clock.wall(), seq=2, step=6)  # alive again
    m.poll(clock.advance(5))
    assert out == [] and m.heartbeats() == {0: 5.0}
    m.poll(clock.advance(4))
    assert out == []
    m.poll(clock.advance(1.5))
    assert len(out) == 1
    d = out[0]
    assert d.cause is Cause.HANG and d.step == 6 and d.source == "heartbeat"
    assert d.details["kind"] == "heartbeat" and d.details["rank"] == 0 and d.details["timeout_source"] == "config"
    assert "rank 0 no heartbeat for 10.5 s" in d.summary
    m.poll(clock.advance(100))
    assert len(out) == 1  # once per attempt


def test_hang_reported_within_check_interval_of_timeout(setup: tuple[Clock, Path, list[Detection]]) -> None:
    clock, hb, out = setup
    m = monitor(HeartbeatConfig(timeout_s=5, check_interval_s=0.25), clock, hb, out)
    write_hb(hb, 0, clock.wall(), seq=1)
    # fake time moves 0.1 s a poll; the real deadline only stops a monitor that never fires
    def hung() -> bool:
        m.poll(clock.advance(0.1))
        return bool(out)
    wait_for(hung, timeout=10, interval=0, what="the hang detection")
    assert 5.0 < out[0].details["age_s"] <= 5.0 + 0.25 + 0.1  # type: ignore[operator]


def test_checkpointing_allowance(setup: tuple[Clock, Path, list[Detection]]) -> None:
    clock, hb, out = setup
    m = monitor(HeartbeatConfig(timeout_s=10, checkpoint_timeout_s=100, **FAST), clock, hb, out)
    write_hb(hb, 0, clock.wall(), seq=1, step=100, state="checkpointing")
    m.poll(clock.advance(50))
    assert out == [] and m.status()["checkpointing"] == [0]
    m.poll(clock.advance(51))
    assert out[0].details["kind"] == "checkpointing" and out[0].details["timeout_s"] == 100


def test_startup_timeout_only_when_heartbeats_are_expected(setup: tuple[Clock, Path, list[Detection]]) -> None:
    clock, hb, out = setup
    cfg = HeartbeatConfig(timeout_s=10, startup_timeout_s=30, **FAST)
    m = monitor(cfg, clock, hb, out)
    m.poll(clock.advance(1000))
    assert out == []  # a job without the client is not a hang
    m2 = monitor(HeartbeatConfig(timeout_s=10, startup_timeout_s=30, expect_heartbeats=True, **FAST), clock, hb, out)
    m2.poll(clock.advance(29))
    assert out == []
    m2.poll(clock.advance(2))
    assert out[0].details["kind"] == "startup" and "no rank sent a heartbeat within 30 s" in out[0].summary


def test_startup_expected_after_an_attempt_sent_heartbeats(setup: tuple[Clock, Path, list[Detection]]) -> None:
    clock, hb, out = setup
    cfg = HeartbeatConfig(timeout_s=10, startup_timeout_s=30, **FAST)
    m = monitor(cfg, clock, hb, out)
    write_hb(hb, 0, clock.wall(), seq=1)
    m.poll(clock.advance(1))
    m.stop()
    monitor(cfg, clock, hb, out, attempt=1, mon=m)  # attempt 1: the old attempt's file is ignored
    m.poll(clock.advance(20))
    assert out == [] and m.heartbeats() == {}
    m.poll(clock.advance(11))
    assert out and out[0].details["kind"] == "startup"


def test_missing_ranks_of_world(setup: tuple[Clock, Path, list[Detection]]) -> None:
    clock, hb, out = setup
    m = monitor(HeartbeatConfig(timeout_s=100, startup_timeout_s=30, **FAST), clock, hb, out)
    for i in range(40):
        write_hb(hb, 0, clock.wall(), seq=i + 1, world_size=4)
        write_hb(hb, 2, clock.wall(), seq=i + 1, world_size=4)
        m.poll(clock.advance(1))
    assert out and out[0].details["kind"] == "startup"
    assert "rank(s) 1, 3 of 4" in out[0].summary


def test_learned_timeout(setup: tuple[Clock, Path, list[Detection]]) -> None:
    clock, hb, out = setup
    cfg = HeartbeatConfig(learn_after=5, learn_factor=3.0, learn_floor_s=1.0, initial_timeout_s=50, **FAST)
    m = monitor(cfg, clock, hb, out)
    write_hb(hb, 0, clock.wall(), seq=1)
    m.poll(clock.advance(0.5))
    assert m.timeout() == (50, "initial")
    for i in range(5):
        clock.advance(1.5 if i != 2 else 2.0)  # the longest interval: 2 s
        write_hb(hb, 0, clock.wall(), seq=i + 2)
        m.poll(clock.advance(0.01))
    assert m.timeout() == (pytest.approx(6.03, abs=1e-3), "learned")  # (2 s + 0.01 s) x 3
    m.poll(clock.advance(5.5))
    assert out == []
    m.poll(clock.advance(1))
    assert out and out[0].details["timeout_source"] == "learned"


def test_learned_timeout_never_below_floor_and_ignores_checkpoint_intervals(
        setup: tuple[Clock, Path, list[Detection]]) -> None:
    clock, hb, out = setup
    cfg = HeartbeatConfig(learn_after=3, learn_factor=2.0, learn_floor_s=60, **FAST)
    m = monitor(cfg, clock, hb, out)
    seq = 0
    for state in ["running", "running", "checkpointing", "running", "running", "running"]:
        seq += 1
        write_hb(hb, 0, clock.wall(), seq=seq, state=state)
        m.poll(clock.advance(500 if state == "checkpointing" else 1))
    assert m.timeout() == (60, "learned")
    assert m.status()["intervals_seen"] == 3


def test_output_and_progress_stall(setup: tuple[Clock, Path, list[Detection]]) -> None:
    clock, hb, out = setup
    m = monitor(HeartbeatConfig(output_stall_timeout_s=20, progress_stall_timeout_s=60, **FAST), clock, hb, out)
    for _ in range(6):
        m.note_output(clock.advance(10))  # output keeps coming, but no new step
        m.poll(clock.mono)
    assert out == []
    m.note_output(clock.advance(10))
    m.poll(clock.mono)
    assert [d.details["kind"] for d in out] == ["progress_stall"]
    out.clear()
    m2 = monitor(HeartbeatConfig(output_stall_timeout_s=20, **FAST), clock, hb, out)
    m2.note_output(clock.advance(5))
    m2.poll(clock.advance(15))
    assert out == []
    m2.poll(clock.advance(6))
    assert out[0].details["kind"] == "output_stall"


def test_progress_stall_through_the_logwatcher(setup: tuple[Clock, Path, list[Detection]]) -> None:
    from supervisor.watch.config import DetectorsConfig
    from supervisor.watch.logwatch import LogWatcher

    clock, hb, out = setup
    m = monitor(HeartbeatConfig(progress_stall_timeout_s=30, **FAST), clock, hb, out)
    w = LogWatcher(DetectorsConfig(), out.append, lambda r: None, clock=lambda: clock.mono)
    w.set_progress(m)
    for i in range(5):
        w.feed("stdout", [f"iter {i}: loss 2.5, time 1ms"])
        m.poll(clock.advance(10))
    for _ in range(2):  # the last new step was at the 5th feed; 30 s pass without another
        w.feed("stdout", ["iter 4: loss 2.5, time 1ms", "just chatter"])  # no new step
        m.poll(clock.advance(10))
    assert out == []
    m.poll(clock.advance(10))
    assert out and out[0].details["kind"] == "progress_stall"


def test_client_env_keeps_interval_below_timeout() -> None:
    assert client_env(HeartbeatConfig()) == {"TSUP_HEARTBEAT_INTERVAL_S": "1"}
    assert client_env(HeartbeatConfig(timeout_s=2)) == {"TSUP_HEARTBEAT_INTERVAL_S": "0.5"}


# -- real processes ---------------------------------------------------------------------------

def spawn(args: Sequence[str], env: dict[str, str]) -> subprocess.Popen[str]:
    full = {**os.environ, "PYTHONPATH": str(REPO), **env}
    return subprocess.Popen([sys.executable, *args], env=full, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)


def reap(p: subprocess.Popen[str]) -> None:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
    p.wait(timeout=10)
    if p.stdout:
        p.stdout.close()


class Lines:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lines: list[tuple[str, str]] = []

    def feed(self, source: str, lines: Sequence[str]) -> None:
        with self.lock:
            self.lines.extend((source, ln) for ln in lines)


def test_real_child_that_stops_heartbeating_is_hung(tmp_path: Path) -> None:
    hb = tmp_path / "hb"
    sink = Lines()
    cfg = HeartbeatConfig(timeout_s=1.0, check_interval_s=0.05)
    m = HeartbeatMonitor(cfg, metrics_sink=sink, tail_poll_interval_s=0.05)
    out: list[Detection] = []
    started = time.monotonic()
    p = spawn([str(HELPERS / "watch_heartbeat_child.py"), "30", "hang"],
              {"TSUP_RUN_ID": "r1", "TSUP_ATTEMPT": "0", "TSUP_HEARTBEAT_DIR": str(hb), "RANK": "0",
               **client_env(cfg)})
    try:
        m.start(ctx_for(hb, started), out.append)

        def hung() -> bool:
            m.poll(time.monotonic())
            return bool(out)
        wait_for(hung, 20, interval=0.05, what="hang detection")
        d = out[0]
        assert d.cause is Cause.HANG and d.details["rank"] == 0 and d.details["pid"] == p.pid
        # The step of the last heartbeat *written* (the client writes at most every interval).
        on_disk = json.loads((hb / "heartbeat-rank0.json").read_text())
        assert d.step is not None and d.step == on_disk["step"] and 0 <= d.step <= 29 and on_disk["pid"] == p.pid
        # Detected at the timeout, not long after it (a margin a loaded machine meets).
        assert 1.0 <= d.details["age_s"] < 6.0  # type: ignore[operator]  # rounded: may equal the timeout
        # The client's metric reports came through the metrics tailer.
        wait_for(lambda: len(sink.lines) >= 30, 5, what="metric lines")
        src, first = sink.lines[0]
        assert src == f"file:{hb / 'metrics-rank0.jsonl'}"
        assert json.loads(first)["step"] == 0 and json.loads(first)["loss"] == 2.5
        # Stacks of the hung process.
        path = stacks.dump_stacks(stacks.group_pids(p.pid), tmp_path / "state", timeout_s=10)
        assert path is not None and path.exists()
        text = path.read_text()
        assert f"pid {p.pid}" in text and "stuck_in_collective" in text
    finally:
        m.close()
        reap(p)


def test_healthy_child_is_not_hung(tmp_path: Path) -> None:
    hb = tmp_path / "hb"
    cfg = HeartbeatConfig(timeout_s=1.0, check_interval_s=0.05)
    m = HeartbeatMonitor(cfg)
    out: list[Detection] = []
    p = spawn([str(HELPERS / "watch_heartbeat_child.py"), "60", "exit"],
              {"TSUP_RUN_ID": "r1", "TSUP_HEARTBEAT_DIR": str(hb), **client_env(cfg)})
    try:
        m.start(ctx_for(hb, time.monotonic()), out.append)

        def done() -> bool:
            m.poll(time.monotonic())
            return p.poll() is not None
        wait_for(done, 20, interval=0.05)
        assert p.returncode == 0 and out == []
        assert 0 in m.heartbeats()
    finally:
        reap(p)


def test_py_spy_dump_of_a_sleeping_child(tmp_path: Path) -> None:
    p = spawn([str(HELPERS / "watch_sleeper_child.py")], {})
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        path = stacks.dump_stacks([p.pid], tmp_path / "state", timeout_s=10, label="test")
        assert path is not None and path.name.startswith("stacks-test-")
        assert "waiting_for_godot" in path.read_text()
        assert stacks.group_pids(p.pid) == [p.pid]
    finally:
        reap(p)


def test_missing_py_spy_is_reported_plainly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stacks, "find_py_spy", lambda: None)
    assert stacks.dump_stacks([os.getpid()], tmp_path) is None
    assert not list(tmp_path.iterdir())
    # A py-spy that cannot run is recorded in the file, never raised.
    path = stacks.dump_stacks([os.getpid()], tmp_path, py_spy=str(tmp_path / "no-such-py-spy"))
    assert path is not None and "could not run" in path.read_text()


def test_stale_file_from_an_earlier_run_is_ignored(setup: tuple[Clock, Path, list[Detection]]) -> None:
    clock, hb, out = setup
    write_hb(hb, 0, clock.wall() - 3600, seq=7)  # same attempt number, written an hour ago
    m = monitor(HeartbeatConfig(timeout_s=10, **FAST), clock, hb, out)
    m.poll(clock.advance(60))
    assert out == [] and m.heartbeats() == {}
    write_hb(hb, 0, clock.wall(), seq=8)
    m.poll(clock.advance(1))
    assert m.heartbeats() == {0: 1.0}


def test_wired_like_the_runner_client_nan_report_becomes_a_detection(tmp_path: Path) -> None:
    from supervisor.watch.config import DetectorsConfig
    from supervisor.watch.logwatch import LogWatcher

    hb = tmp_path / "hb"
    out: list[Detection] = []
    metrics: list = []
    lw = LogWatcher(DetectorsConfig(), out.append, metrics.append)
    m = HeartbeatMonitor(HeartbeatConfig(timeout_s=30, check_interval_s=0.05), metrics_sink=lw,
                         tail_poll_interval_s=0.05)
    lw.set_progress(m)
    lw.reset(0, None)
    m.start(ctx_for(hb, time.monotonic()), out.append)
    code = ("from supervisor import client\n"
            "for s in range(1, 8):\n"
            "    client.heartbeat(s); client.report(s, loss=float('nan') if s >= 5 else 2.0)\n")
    p = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO), "TSUP_RUN_ID": "r",
                                                            "TSUP_HEARTBEAT_DIR": str(hb)}, timeout=30, check=True)
    try:
        assert p.returncode == 0
        # The main loop polls the monitor: its bounded listing names the metric files to the tailer.
        def polled() -> list[Detection]:
            m.poll(time.monotonic())
            return out

        wait_for(polled, 10, what="nan detection from client reports")
        d = out[0]
        assert d.cause is Cause.NAN and (d.step, d.onset_step) == (5, 5)
        assert d.source == f"file:{hb / 'metrics-rank0.jsonl'}"
        assert lw.last_metric() is not None and lw.last_metric().fmt == "client"  # type: ignore[union-attr]
    finally:
        m.close()


def test_per_attempt_heartbeat_dirs(tmp_path: Path) -> None:
    sink = Lines()
    clock = Clock()
    out: list[Detection] = []
    m = HeartbeatMonitor(HeartbeatConfig(timeout_s=10, check_interval_s=0.01), metrics_sink=sink, wall=clock.wall,
                         tail_poll_interval_s=0.05)
    try:
        d0, d1 = tmp_path / "attempt-0", tmp_path / "attempt-1"
        m.start(ctx_for(d0, clock.mono, attempt=0), out.append)
        write_hb(d0, 0, clock.wall(), seq=1, attempt=0)
        (d0 / "metrics-rank0.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
        m.poll(clock.advance(1))
        wait_for(lambda: len(sink.lines) == 1, 5)
        m.stop()
        d1.mkdir()
        m.start(ctx_for(d1, clock.mono, attempt=1), out.append)
        write_hb(d1, 0, clock.wall(), seq=1, attempt=1, step=7)
        (d1 / "metrics-rank0.jsonl").write_text('{"step": 7, "loss": 2.0}\n')
        m.poll(clock.advance(1))
        assert m.heartbeats() == {0: 1.0}
        wait_for(lambda: len(sink.lines) == 2, 5)
        assert sink.lines[1] == (f"file:{d1 / 'metrics-rank0.jsonl'}", '{"step": 7, "loss": 2.0}')
        assert out == []
    finally:
        m.close()
