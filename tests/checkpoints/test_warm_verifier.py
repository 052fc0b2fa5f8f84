"""The warm verifier: one long-lived load-test process of the job's Python answers many load
tests (torch imported once); any doubt falls back to a cold process per test with the same verdict."""
from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

import pytest

from supervisor.checkpoints.loadtest import LoadTestCancelled, LoadTests
from supervisor.checkpoints.warm import MAX_CRASHES, WarmVerifier
from tests.conftest import pid_alive
from tests.helpers import ckpt_factory as F
from tests.util import wait_for


def _tests(python: str = sys.executable, timeout_s: float = 120) -> LoadTests:
    return LoadTests(python, expected_keys=(), check_finite=True, trust_pickles=False, mmap=False,
                     timeout_s=timeout_s, cwd=None, warm=True)


def _stand_in(tmp: Path, serve_body: str) -> str:
    """An interpreter for the job: the real one, except that its warm mode (``--serve``) runs
    ``serve_body`` instead (a shell snippet)."""
    py = tmp / "python"
    py.write_text(f'#!/bin/sh\nfor a in "$@"; do [ "$a" = --serve ] && {{ {serve_body}; }}; done\n'
                  f'exec {sys.executable} "$@"\n')
    py.chmod(0o755)
    return str(py)


@pytest.mark.slow
def test_many_checkpoints_one_process_and_the_same_verdicts_as_cold(tmp_path: Path) -> None:
    good = [F.torch_file(tmp_path / f"step_{s}.pt", s) for s in (10, 20, 30)]
    bad = F.torch_file(tmp_path / "step_40.pt", 40, nan=True)
    tests = _tests()
    try:
        results = [tests.run(p, None) for p in good]
        assert tests.warm is not None
        first = tests.warm._proc
        assert first is not None and first.poll() is None
        nan = tests.run(bad, None, finite=True)
        assert tests.warm._proc is first  # the same process answered all four
        assert tests.warm.served == 4
    finally:
        tests.cancel()
    assert [r.passed for r in results] == [True, True, True] and [r.step for r in results] == [10, 20, 30]
    assert not nan.passed and "non-finite" in (nan.error or ""), nan
    cold = LoadTests(sys.executable, expected_keys=(), check_finite=True, trust_pickles=False, mmap=False,
                     timeout_s=120, cwd=None).run(bad, None, finite=True)
    assert (cold.passed, cold.error, cold.nonfinite) == (nan.passed, nan.error, nan.nonfinite)


def test_a_killed_warm_process_is_replaced_and_the_test_still_answers(tmp_path: Path) -> None:
    a, b = F.torch_file(tmp_path / "step_1.pt", 1), F.torch_file(tmp_path / "step_2.pt", 2)
    tests = _tests()
    try:
        assert tests.run(a, None).passed
        assert tests.warm is not None and tests.warm._proc is not None
        pid = tests.warm._proc.pid
        os.killpg(pid, signal.SIGKILL)
        wait_for(lambda: not pid_alive(pid), 10, what="the warm process gone")
        res = tests.run(b, None)  # the dead process answers nothing: this one runs cold, the verdict stands
        assert res.passed and res.step == 2, res
        assert tests.warm.available  # one death is not enough to turn it off
    finally:
        tests.cancel()


@pytest.mark.slow
def test_an_interpreter_whose_warm_mode_dies_falls_back_to_cold_tests_and_turns_it_off(tmp_path: Path) -> None:
    cks = [F.torch_file(tmp_path / f"step_{s}.pt", s) for s in range(1, MAX_CRASHES + 2)]
    tests = _tests(_stand_in(tmp_path, "exit 7"))
    try:
        res = [tests.run(p, None) for p in cks]
    finally:
        tests.cancel()
    assert all(r.passed for r in res) and [r.step for r in res] == list(range(1, MAX_CRASHES + 2)), res
    assert tests.warm is not None and not tests.warm.available and tests.warm.served == 0


def test_a_hung_warm_load_test_times_out_and_its_process_is_killed(tmp_path: Path) -> None:
    ck = F.torch_file(tmp_path / "step_3.pt", 3)
    tests = _tests(_stand_in(tmp_path, "exec sleep 600"), timeout_s=1.0)
    try:
        res = tests.run(ck, None)
        assert tests.warm is not None and tests.warm._proc is None
    finally:
        tests.cancel()
    assert not res.passed and "timed out after 1 s" in (res.error or ""), res


def test_cancel_stops_a_warm_test_under_way_and_no_verdict_is_kept(tmp_path: Path) -> None:
    ck = F.torch_file(tmp_path / "step_4.pt", 4)
    tests = _tests(_stand_in(tmp_path, "exec sleep 600"))
    got: list[BaseException | object] = []

    def run() -> None:
        try:
            got.append(tests.run(ck, None))
        except LoadTestCancelled as e:
            got.append(e)

    t = threading.Thread(target=run)
    t.start()
    warm = tests.warm
    assert warm is not None
    proc = wait_for(lambda: warm._proc, 30, what="the warm process")
    tests.cancel()
    t.join(30)
    assert not t.is_alive() and isinstance(got[0], LoadTestCancelled), got
    wait_for(lambda: not pid_alive(proc.pid), 10, what="the warm process killed")
    assert tests.cached(ck) is None


def test_a_busy_warm_process_sends_the_second_test_to_a_cold_one(tmp_path: Path) -> None:
    ck = F.torch_file(tmp_path / "step_5.pt", 5)
    warm = WarmVerifier(_stand_in(tmp_path, "exec sleep 600"), None)
    try:
        t = threading.Thread(target=lambda: warm.request('{"path": "x"}', 60))
        t.start()
        wait_for(lambda: warm._busy.locked() and warm._proc is not None, 30, what="the warm process busy")
        assert warm.request('{"path": "y"}', 60) is None  # busy: the caller runs it cold
    finally:
        warm.close()
        t.join(30)
    assert not t.is_alive()
    assert ck.exists()


@pytest.mark.parametrize("idle_s", [0.3])
def test_an_idle_warm_process_is_closed_and_started_again_when_needed(tmp_path: Path, idle_s: float) -> None:
    a, b = F.torch_file(tmp_path / "step_6.pt", 6), F.torch_file(tmp_path / "step_7.pt", 7)
    tests = _tests()
    assert tests.warm is not None
    tests.warm.idle_s = idle_s
    try:
        assert tests.run(a, None).passed
        proc = tests.warm._proc
        assert proc is not None
        wait_for(lambda: tests.warm is not None and tests.warm._proc is None, 30, what="the idle process closed")
        wait_for(lambda: not pid_alive(proc.pid), 10, what="its pid gone")
        assert tests.run(b, None).passed and tests.warm.served == 2
    finally:
        tests.cancel()
