"""[heartbeat] max_busy_s, fast: a job that a look finds busy at every suspicion is held back
only until it has been silent ``max_busy_s``; then the hang goes out anyway, whichever way the
bound is reached (a look's busy verdict past it, or a poll between looks). The gate's clock is
the ``now`` it is offered; only the look's short sampling window is real."""
from __future__ import annotations

import time
import itertools
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from supervisor.core.causes import Cause
from supervisor.events import AttemptContext
from supervisor.core.observations import Detection
from supervisor.watch.config import HeartbeatConfig
from supervisor.watch.hanggate import HangGate
from supervisor.watch.look import LookResult, Stack
from tests.util import wait_for

MAX_BUSY_S = 600.0


class AlwaysBusy:
    """One process that uses a full core and whose stack moves at every sample."""

    def __init__(self) -> None:
        self._cpu = itertools.count(0.0, 0.05)  # a core's worth over the look's window
        self._line = itertools.count(1)

    def processes(self, root_pid: int) -> dict[int, str]:
        return {root_pid: "python train.py"}

    def cpu_seconds(self, pids: Sequence[int]) -> dict[int, float]:
        cpu = next(self._cpu)
        return {p: cpu for p in pids}

    def stopped(self, pids: Sequence[int]) -> set[int]:
        return set()

    def stacks(self, pids: Sequence[int], timeout_s: float) -> dict[int, Stack]:
        inner = "    forward (model.py:12)\n" if next(self._line) % 2 else ""  # a call in, a call out
        return {p: Stack(f'Process {p}: python train.py\nThread {p} (active): "MainThread"\n{inner}'
                         "    evaluate (train.py:41)\n    main (train.py:90)\n") for p in pids}


def _gate(tmp_path: Path) -> tuple[HangGate, list[float]]:
    cfg = replace(HeartbeatConfig(), look_s=0.05, max_busy_s=MAX_BUSY_S, dump_stacks=False)
    busy: list[float] = []
    gate = HangGate(cfg, probe=AlwaysBusy(), on_busy=lambda det, res, busy_for: busy.append(busy_for))
    gate.start(AttemptContext("r", 0, 4242, 4242, 0.0, tmp_path, tmp_path / "hb", None, None, None))
    return gate, busy


HANG = Detection(Cause.HANG, "no output for 300 s (timeout 300 s)", "output", details={"timeout_s": 300.0}, at=time.time())


def _look_done(gate: HangGate) -> LookResult | None:
    """Wait for the look under way (its thread samples for look_s)."""
    look = gate._look
    assert look is not None, "no look was started"
    wait_for(look.done, 30, what="the look's verdict")
    return look.result()


def _held_busy(gate: HangGate, busy: list[float], now: float) -> None:
    assert gate.offer(now, HANG) is None  # a look starts; the detection is held
    res = _look_done(gate)
    assert res is not None and res.verdict.busy, res
    assert gate.offer(now + 1.0, HANG) is None and busy[-1] == 1.0  # busy: extended, on_busy told
    assert gate._look is None  # the next look is due after the timeout that fired (300 s)


def _bounded(det: Detection | None, busy_for: float) -> None:
    assert det is not None, "max_busy_s passed and the hang was still held"
    assert det.cause is Cause.HANG
    assert f"busy but silent for {busy_for:.0f} s (max_busy_s {MAX_BUSY_S:g})" in det.summary
    assert det.details["busy_for_s"] == busy_for and det.details["max_busy_s"] == MAX_BUSY_S


def test_a_busy_job_is_held_then_reported_once_max_busy_s_has_passed_between_looks(tmp_path: Path):
    gate, busy = _gate(tmp_path)
    _held_busy(gate, busy, 0.0)
    assert gate.offer(299.0, HANG) is None and gate._look is None  # before the next look: held
    assert gate.offer(MAX_BUSY_S - 0.5, HANG) is None and gate._look is not None  # due (301 s): a look
    _look_done(gate)
    assert gate.offer(MAX_BUSY_S - 0.1, HANG) is None and busy == [1.0, MAX_BUSY_S - 0.1]  # busy, under the bound
    _bounded(gate.offer(MAX_BUSY_S + 5.0, HANG), MAX_BUSY_S + 5.0)  # a poll past it, no look under way


def test_a_look_that_says_busy_past_max_busy_s_reports_the_hang(tmp_path: Path):
    gate, busy = _gate(tmp_path)
    _held_busy(gate, busy, 0.0)
    assert gate.offer(400.0, HANG) is None and gate._look is not None  # the second look (due at 301 s)
    _look_done(gate)
    _bounded(gate.offer(MAX_BUSY_S + 1.0, HANG), MAX_BUSY_S + 1.0)  # its verdict busy, but past the bound
    assert busy == [1.0]  # not told busy again


def test_progress_ends_the_suspicion_and_the_bound_starts_over(tmp_path: Path):
    gate, busy = _gate(tmp_path)
    _held_busy(gate, busy, 0.0)
    assert gate.offer(0.5, None) is None  # a step was printed: nothing to report, the suspicion over
    _held_busy(gate, busy, 1000.0)  # a new silence: held again
    assert gate.offer(1000.0 + MAX_BUSY_S - 1.0, HANG) is None and gate._look is not None
    _look_done(gate)
    _bounded(gate.offer(1000.0 + MAX_BUSY_S + 1.0, HANG), MAX_BUSY_S + 1.0)  # counted from 1000 s, not 0


class NoneLeft(AlwaysBusy):
    """The job's processes are gone (it exited; its output is still being read)."""

    def processes(self, root_pid: int) -> dict[int, str]:
        return {}


def test_a_silence_after_every_process_of_the_job_is_gone_is_no_hang(tmp_path: Path) -> None:
    """A job that exited while its output is still being parsed is silent, not hung: the look
    finds no process, the detection is held (the exit decides the attempt's end), and the next
    look waits its window."""
    cfg = replace(HeartbeatConfig(), look_s=0.05, max_busy_s=MAX_BUSY_S, dump_stacks=False)
    gate = HangGate(cfg, probe=NoneLeft(), on_busy=None)
    gate.start(AttemptContext("r", 0, 4242, 4242, 0.0, tmp_path, tmp_path / "hb", None, None, None))
    assert gate.offer(100.0, HANG) is None  # a look starts
    res = _look_done(gate)
    assert res is not None and not res.look.procs
    assert gate.offer(101.0, HANG) is None  # held: no process to be hung
    assert gate.offer(101.01, HANG) is None and gate._look is None  # the next look waits look_s
