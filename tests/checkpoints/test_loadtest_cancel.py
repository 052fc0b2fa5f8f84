"""When the supervisor exits, the load tests under way are stopped (their process groups killed)
and their callers told so: a test cut short is no verdict, so nothing is cached for the version
and no later test starts."""
from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from supervisor.checkpoints.loadtest import LoadTestCancelled, LoadTests
from tests.helpers import ckpt_factory as F
from tests.util import wait_for


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_cancel_stops_the_test_under_way_and_every_caller_waiting_on_it(tmp_path: Path) -> None:
    ck = F.torch_file(tmp_path / "ck" / "step_3.pt", 3)
    pids = tmp_path / "pids"
    # The test's interpreter stands in for a torch import that takes long: it records its pid
    # and a child of its own (the group is killed, not only the leader), then waits.
    python = tmp_path / "slow-python"
    python.write_text(f"#!/bin/sh\nsleep 600 &\necho $$ $! >> {pids}\nwait\n")
    python.chmod(0o755)
    tests = LoadTests(str(python), expected_keys=(), check_finite=False, trust_pickles=False, mmap=False,
                      timeout_s=600, cwd=None)
    raised: list[BaseException] = []

    def call() -> None:
        try:
            tests.run(ck, None)
        except BaseException as e:
            raised.append(e)

    def finite_call() -> None:
        try:
            tests.run(ck, None, finite=True)
        except BaseException as e:
            raised.append(e)

    # Two tests of one version (without and with the finite check) run at once; a third caller
    # waits on the first one's result.
    callers = [threading.Thread(target=call), threading.Thread(target=finite_call)]
    for t in callers:
        t.start()
    wait_for(lambda: pids.exists() and len(pids.read_text().split()) == 4, 30, what="the load tests' processes")
    callers.append(threading.Thread(target=call))
    callers[-1].start()  # the same version: waits on the first one's result (or finds the tests stopped)
    assert tests.cancel() == [str(ck)]
    for t in callers:
        t.join(timeout=30)
    assert len(raised) == 3 and all(isinstance(e, LoadTestCancelled) for e in raised), raised
    started = [int(p) for p in pids.read_text().split()]
    wait_for(lambda: not any(_alive(p) for p in started), 10, what="every test's process group gone")
    assert tests.cached(ck) is None and tests.cached(ck, finite=True) is None  # no verdict kept
    with pytest.raises(LoadTestCancelled, match="exiting"):
        tests.run(ck, None)  # and none started after
    assert len(pids.read_text().split()) == 4


def test_cancel_with_nothing_under_way_stops_nothing_and_keeps_the_verdicts(tmp_path: Path) -> None:
    ck = F.torch_file(tmp_path / "ck" / "step_4.pt", 4)
    tests = LoadTests(sys.executable, expected_keys=(), check_finite=False, trust_pickles=False, mmap=False,
                      timeout_s=120, cwd=None)
    assert tests.run(ck, None).passed
    assert tests.cancel() == []
    assert tests.run(ck, None).passed  # the cached verdict still answers
