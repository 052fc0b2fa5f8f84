"""A load test runs below the job in CPU priority and in the idle IO class, also where the kernel shares CPU time between
sessions first (sched_autogroup): there a nice value only ranks a process within its session, and
the load test has a session of its own, so that session's nice is lowered too. A version already
under test is not tested again beside it. When the supervisor exits, the tests under way are
stopped (their process groups killed) and their callers told so: a test cut short is no verdict,
so nothing is cached for the version and no later test starts."""
from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

from supervisor.checkpoints.loadtest import LoadTestCancelled, LoadTestRequest, LoadTestResult, LoadTests, run_load_test
from tests.conftest import pid_alive
from tests.helpers import ckpt_factory as F
from tests.util import wait_for


def _load_test_pid(marker: str) -> int | None:
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if marker in (p / "cmdline").read_text(errors="replace"):
                    return int(p.name)
            except OSError:
                continue
    return None


def _priority(pid: int) -> tuple[int, str | None]:
    """(the process's nice, its session group's line in /proc/PID/autogroup or None)."""
    nice = int((Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split())[16])
    try:
        group = Path(f"/proc/{pid}/autogroup").read_text().strip()
    except OSError:
        group = None  # a kernel without autogroup
    return nice, group


def _io_class(pid: int) -> int | None:
    """The process's IO class (3: idle) from ioprio_get, or None where it cannot be read."""
    import ctypes

    from supervisor.checkpoints._loadtest_script import IOPRIO_CLASS_SHIFT, IOPRIO_SYSCALLS, IOPRIO_WHO_PROCESS

    nrs = IOPRIO_SYSCALLS.get(os.uname().machine)
    if nrs is None:
        return None
    prio = ctypes.CDLL(None, use_errno=True).syscall(nrs[1], IOPRIO_WHO_PROCESS, pid)
    return None if prio < 0 else prio >> IOPRIO_CLASS_SHIFT


def _load_tests(python: Path, script: str, timeout_s: float = 120) -> LoadTests:
    """Load tests run by ``python``: a shell script standing in for the job's interpreter."""
    python.write_text(script)
    python.chmod(0o755)
    return LoadTests(str(python), expected_keys=(), check_finite=False, trust_pickles=False, mmap=False,
                     timeout_s=timeout_s, cwd=None)


def _autogroup_enabled() -> bool:
    f = Path("/proc/sys/kernel/sched_autogroup_enabled")
    return f.exists() and f.read_text().strip() == "1"


def test_the_load_test_runs_below_the_job_in_cpu_priority(tmp_path: Path) -> None:
    ck = F.torch_file(tmp_path / "priority-probe-ck" / "step_5.pt", 5)
    result: list[LoadTestResult] = []
    t = threading.Thread(target=lambda: result.append(run_load_test(LoadTestRequest(ck), python=sys.executable,
                                                                    timeout_s=120)))
    t.start()
    seen: list[tuple[int, str | None]] = []
    io: list[int | None] = []
    grouped = _autogroup_enabled()
    lowered_nice = min(19, os.nice(0) + 10)  # 10 below this test's own priority (it may run under nice)

    def lowered() -> bool:
        pid = _load_test_pid(str(ck))
        if pid is None:
            return False
        try:
            seen.append(_priority(pid))
        except (OSError, IndexError, ValueError):
            return False  # it ended between the two reads
        nice, group = seen[-1]
        io.append(_io_class(pid))
        return (nice == lowered_nice and (not grouped or group is None or group.endswith("nice 10"))
                and io[-1] in (3, None))

    try:
        # Polled while it runs (its torch import takes a second or more): the priority is set
        # first thing in the script, so the samples end on the lowered one.
        wait_for(lambda: lowered() or bool(result), timeout=60, interval=0.005, what="the load test process")
    finally:
        t.join(timeout=120)
    assert result and result[0].passed, result
    assert seen, "the load test process was never seen running"
    nice, group = seen[-1]
    assert nice == lowered_nice, seen
    if grouped and group is not None:
        assert group.endswith("nice 10"), seen  # its own session, below the job's
    assert io[-1] in (3, None), io  # the idle IO class (3) where ioprio_get answers: the disk is the job's first


@pytest.mark.slow
def test_a_version_under_test_is_not_tested_again_beside_it(tmp_path: Path) -> None:
    """After a kill, the background test of the newest save and the one beside the relaunch ask
    for the same version: one subprocess, both callers get its result."""
    ck = F.torch_file(tmp_path / "ck" / "step_7.pt", 7)
    started = tmp_path / "started"
    tests = _load_tests(tmp_path / "counting-python",
                        f'#!/bin/sh\necho "$$" >> {started}\nexec {sys.executable} "$@"\n')
    results: list[LoadTestResult] = []
    first = threading.Thread(target=lambda: results.append(tests.run(ck, None)))
    first.start()
    wait_for(lambda: started.exists(), timeout=60, what="the first load test's process")
    second = threading.Thread(target=lambda: results.append(tests.run(ck, None, finite=False)))
    second.start()
    first.join(timeout=120)
    second.join(timeout=120)
    assert len(results) == 2 and results[0] is results[1] and results[0].passed, results
    assert len(started.read_text().split()) == 1  # one subprocess for the two callers
    # A finite-checked request is not answered by the unchecked result: it runs its own test.
    assert tests.run(ck, None, finite=True).passed
    assert len(started.read_text().split()) == 2


def test_cancel_stops_the_test_under_way_and_every_caller_waiting_on_it(tmp_path: Path) -> None:
    ck = F.torch_file(tmp_path / "ck" / "step_3.pt", 3)
    pids = tmp_path / "pids"
    # The test's interpreter stands in for a torch import that takes long: it records its pid
    # and a child of its own (the group is killed, not only the leader), then waits.
    tests = _load_tests(tmp_path / "slow-python", f"#!/bin/sh\nsleep 600 &\necho $$ $! >> {pids}\nwait\n", 600)
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

    def started(n: int) -> bool:
        return pids.exists() and len(pids.read_text().split()) == n

    # Two tests of one version run at once: without the finite check, then with it (started the
    # other way round, the first would answer both); a third caller waits on the first's result.
    callers = [threading.Thread(target=call), threading.Thread(target=finite_call)]
    try:
        callers[0].start()
        wait_for(lambda: started(2), 30, what="the first load test's processes")
        callers[1].start()
        wait_for(lambda: started(4), 30, what="the finite-checked load test's processes")
        callers.append(threading.Thread(target=call))
        callers[-1].start()  # the same version: waits on the first one's result (or finds the tests stopped)
    finally:
        stopped = tests.cancel()  # also when a wait failed: no stand-in left running
    assert stopped == [str(ck)]
    for t in callers:
        t.join(timeout=30)
    assert len(raised) == 3 and all(isinstance(e, LoadTestCancelled) for e in raised), raised
    seen = [int(p) for p in pids.read_text().split()]
    wait_for(lambda: not any(pid_alive(p) for p in seen), 10, what="every test's process group gone")
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
