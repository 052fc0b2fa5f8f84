"""Busy or stuck: the pure verdict on scripted samples, and real looks at real processes."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Iterator

import pytest

from supervisor.watch.busy import Look, ProcSample, ProcState, judge, stack_signature, without_locals
from supervisor.watch.look import SystemProbe, take_look
from tests.util import wait_for

A = "Thread 1 \"MainThread\"\nevaluate (train.py:40)\nmain (train.py:90)"
B = "Thread 1 \"MainThread\"\nforward (model.py:12)\nevaluate (train.py:41)\nmain (train.py:90)"
WAIT = "Thread 1 \"MainThread\"\nall_reduce (distributed_c10d.py:2501)\nstep (train.py:50)"


def proc(pid: int, cpu: float | None, first: str | None, second: str | None, stopped: bool = False) -> ProcSample:
    return ProcSample(pid, f"rank{pid}", cpu, stopped, (first, first, second))


# ------------------------------------------------------------------ the verdict (scripted samples)

def test_moving_stacks_with_cpu_are_busy() -> None:
    v = judge(Look(3.0, (proc(1, 2.9, A, B),)))
    assert v.busy and v.states == {1: ProcState.WORKING} and "stacks moved" in v.reason


def test_still_stacks_or_no_cpu_are_hung() -> None:
    spin = judge(Look(3.0, (proc(1, 3.0, WAIT, WAIT),)))  # NCCL's spin in a dead collective
    assert not spin.busy and spin.states[1] is ProcState.SPINNING and "same stack" in spin.reason
    idle = judge(Look(3.0, (proc(1, 0.0, A, B),)))  # stacks "move" but no CPU: a sleep between lines
    assert not idle.busy and idle.states[1] is ProcState.WAITING and "no CPU" in idle.reason


def test_a_stopped_process_is_hung_even_beside_a_working_one() -> None:
    v = judge(Look(3.0, (proc(1, 2.5, A, B), proc(2, 0.0, WAIT, WAIT, stopped=True))))
    assert not v.busy and v.states[2] is ProcState.STOPPED and "pid 2" in v.reason and "stopped" in v.reason


def test_ddp_one_stuck_rank_while_the_others_wait_in_the_collective_is_hung() -> None:
    agent = proc(10, 0.01, "Thread 10\nsleep (agent.py:5)", "Thread 10\nsleep (agent.py:5)")
    ranks = (proc(11, 0.0, WAIT, WAIT), proc(12, 0.0, "Thread 12\nrecv (c10d.py:9)", "Thread 12\nrecv (c10d.py:9)"))
    v = judge(Look(3.0, (agent, *ranks)))
    assert not v.busy and set(v.states.values()) == {ProcState.WAITING} and v.reason.startswith("nobody works")


def test_ddp_eval_on_rank_0_while_the_others_wait_at_a_barrier_is_busy() -> None:
    v = judge(Look(3.0, (proc(11, 2.8, A, B), proc(12, 0.0, WAIT, WAIT))))
    assert v.busy and v.states == {11: ProcState.WORKING, 12: ProcState.WAITING} and "pid 11" in v.reason


def test_without_stacks_cpu_alone_decides_and_says_so() -> None:
    assert judge(Look(3.0, (proc(1, 2.0, None, None),))).busy
    assert "CPU only" in judge(Look(3.0, (proc(1, 2.0, None, None),))).reason
    assert not judge(Look(3.0, (proc(1, 0.0, None, None),))).busy
    assert not judge(Look(3.0, ())).busy  # nothing left to look at


def test_the_signature_ignores_the_thread_run_state_and_the_header() -> None:
    def dump(state: str) -> str:
        return (f"Process 6194: python train.py\nPython v3.11.7 (/usr/bin/python3.11)\n\n"
                f"Thread 6194 ({state}): \"MainThread\"\n    busy (train.py:6)\n    <module> (train.py:8)\n")

    assert stack_signature(dump("active+gil")) == stack_signature(dump("idle"))
    assert stack_signature(dump("idle")) == 'Thread 6194 "MainThread"\nbusy (train.py:6)\n<module> (train.py:8)'
    assert stack_signature("Process 1: x\nPython v3.11\n") is None


LOCALS_DUMP = """Process 7: python eval.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 7 (active): "MainThread"
    evaluate (eval.py:31)
        Arguments:
            model: <Linear at 0x7f7a56c44850>
        Locals:
            n: {n}
            total: {total}
            x: <Tensor at 0x7f7a3566{n:04d}>
    <module> (eval.py:76)
Thread 9 (idle): "RendezvousKeepAliveTimer_0"
    wait (threading.py:331)
        Locals:
            waiter: <lock at 0x7f00{tick:04d}>
    _run (utils.py:278)
"""


def test_the_signature_keeps_the_main_threads_locals_only() -> None:
    # A loop of short C calls on one line: every sample shows the same frames, but the main
    # thread's locals move (seen on a real DDP eval, where the frames alone made it a "spin").
    a = stack_signature(LOCALS_DUMP.format(n=10, total=1.5, tick=1))
    b = stack_signature(LOCALS_DUMP.format(n=11, total=2.5, tick=1))
    assert a is not None and a != b and "n: 10" in a and "evaluate (eval.py:31)" in a
    # A helper thread's locals (a new waiter at every tick) and values py-spy could not read
    # ("?") change nothing: a job that stands still keeps one signature.
    assert stack_signature(LOCALS_DUMP.format(n=10, total=1.5, tick=2)) == a
    assert stack_signature(LOCALS_DUMP.format(n=10, total="?", tick=1)) != b
    unread = stack_signature(LOCALS_DUMP.format(n=1, total="?", tick=1)) or ""
    assert "waiter" not in a and "total: ?" not in unread and "n: 1" in unread
    # A process that never imported threading: py-spy names no thread; the main one has its pid.
    unnamed = LOCALS_DUMP.replace(': "MainThread"', "")
    assert "n: 10" in (stack_signature(unnamed.format(n=10, total=1.5, tick=1)) or "")
    looks = Look(3.0, (ProcSample(1, "rank0", 2.9, False, (a, a, b)),))
    assert judge(looks).busy


def test_the_stacks_file_shows_frames_without_local_values() -> None:
    text = without_locals(LOCALS_DUMP.format(n=10, total=1.5, tick=1))
    assert "evaluate (eval.py:31)" in text and "_run (utils.py:278)" in text and 'Thread 9 (idle)' in text
    assert "Locals" not in text and "0x7f7a56c44850" not in text and "n: 10" not in text


# ------------------------------------------------------------------ real looks at real processes

JOBS = {
    # A CPU loop in Python that moves between two functions: an evaluation that prints nothing.
    "busy": """
        def forward(n):
            x = 0
            for k in range(n):
                x += k * k
            return x
        def score(n):
            y = 0
            for k in range(n):
                y ^= k
            return y
        def evaluate():
            while True:
                forward(20000)
                score(20000)
        print("ready", flush=True)
        evaluate()
    """,
    # A loop of short C calls written on one line: the frames of every sample are the same (no
    # Python frame below it), the locals are not: working.
    "one_line": """
        def evaluate():
            n, data = 0, list(range(20000))
            while True: n += 1; data = sorted(data, reverse=n % 2 == 0)
        print("ready", flush=True)
        evaluate()
    """,
    # One C call that never returns and burns CPU (catastrophic backtracking): still frames and
    # still locals, as NCCL's spin in a dead collective.
    "spin": """
        import re
        def collective():
            pattern, text = re.compile(r"(a+)+$"), "a" * 64 + "b"
            return pattern.match(text)
        print("ready", flush=True)
        collective()
    """,
    # Blocked in a read that never returns: a rank waiting for a dead peer.
    "blocked": """
        import os
        def wait_for_peer(r):
            return os.read(r, 1)
        r, w = os.pipe()
        print("ready", flush=True)
        wait_for_peer(r)
    """,
}


@pytest.fixture
def job(tmp_path: Path) -> Iterator[object]:
    started: list[subprocess.Popen[str]] = []

    def start(kind: str) -> subprocess.Popen[str]:
        p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(JOBS[kind])], stdout=subprocess.PIPE, text=True)
        started.append(p)
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        return p

    yield start
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait()


def look(pid: int, tmp_path: Path):
    return take_look(SystemProbe(), pid, window_s=2.0, sample_timeout_s=5.0, stacks_dir=tmp_path / "stacks",
                     label="test")


def test_a_real_cpu_loop_with_moving_stacks_is_busy(job, tmp_path: Path) -> None:
    p = job("busy")
    res = look(p.pid, tmp_path)
    assert res.verdict.busy, res.verdict.reason
    assert res.stacks_file is not None and "evaluate" in res.stacks_file.read_text()
    assert res.seconds < 2.0 + 2 * 5.0


def test_a_real_blocked_process_and_a_sigstopped_one_are_hung_with_their_stacks(job, tmp_path: Path) -> None:
    blocked = job("blocked")
    res = look(blocked.pid, tmp_path)
    assert not res.verdict.busy and res.verdict.states[blocked.pid] is ProcState.WAITING, res.verdict.reason
    # Its own stack, as py-spy reads it: the function blocked at the read's line, called from the
    # script's last line, the same in every sample (not just any dump: "<module>" is in almost all).
    src = textwrap.dedent(JOBS["blocked"]).splitlines()
    at = {name: next(i for i, line in enumerate(src, 1) if line.lstrip().startswith(name)) for name in
          ("return os.read", "wait_for_peer(r)")}
    assert res.stacks_file is not None
    text = res.stacks_file.read_text()
    assert f"===== pid {blocked.pid} (" in text and f"Process {blocked.pid}:" in text, text
    assert "): waiting, CPU 0.00 s in the window, 1 distinct stack(s) in" in text, text
    assert (f"    wait_for_peer (<string>:{at['return os.read']})\n    <module> (<string>:{at['wait_for_peer(r)']})"
            in text), text
    busy = job("busy")
    os.kill(busy.pid, signal.SIGSTOP)
    wait_for(lambda: open(f"/proc/{busy.pid}/stat").read().split(") ")[1][0] == "T", 5, what="the stop")
    res = look(busy.pid, tmp_path)
    assert not res.verdict.busy and res.verdict.states[busy.pid] is ProcState.STOPPED, res.verdict.reason
    text = res.stacks_file.read_text()
    assert "evaluate" in text and "stopped" in text  # py-spy --nonblocking reads a stopped process
    os.kill(busy.pid, signal.SIGCONT)


def test_a_real_loop_on_one_line_is_busy_and_a_real_endless_call_is_a_spin(job, tmp_path: Path) -> None:
    one_line = job("one_line")
    res = look(one_line.pid, tmp_path)
    assert res.verdict.busy, res.verdict.reason
    text = res.stacks_file.read_text()
    assert "evaluate" in text and "Locals" not in text  # the file: frames only
    spin = job("spin")
    res = look(spin.pid, tmp_path)
    assert not res.verdict.busy and res.verdict.states[spin.pid] is ProcState.SPINNING, res.verdict.reason
