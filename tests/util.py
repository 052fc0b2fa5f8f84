"""Test helpers: poll for a condition with a deadline instead of sleeping."""
from __future__ import annotations

import time
from typing import Callable, Literal, TypeVar

T = TypeVar("T")


def wait_for(cond: Callable[[], T | None | Literal[False]], timeout: float = 10.0, interval: float = 0.02,
             what: str = "") -> T:
    """Return the first truthy value of ``cond()`` (typed without its None and False); fail the
    test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or cond}")
        time.sleep(interval)


def known(value: T | None) -> T:
    """``value``, failing the test where it is None (an Optional a test expects filled in)."""
    assert value is not None
    return value


def stacks_and_kill_tree(pid: int) -> str:
    """SIGKILL a process and every descendant; return py-spy stack dumps of the Python ones first.

    torchrun starts each rank in a session of its own (start_new_session=True), so killing the
    launcher's process group leaves the ranks running with the test's pipes open, and the test's
    communicate() then waits forever. The dumps say where a hung rank was.
    """
    import shutil
    import signal
    import subprocess

    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return ""
    dumps = []
    spy = shutil.which("py-spy")
    for p in procs:
        if spy is None:
            break
        try:
            cp = subprocess.run([spy, "dump", "--pid", str(p.pid)], capture_output=True, text=True, timeout=20)
            dumps.append(f"--- pid {p.pid}: {' '.join(p.cmdline())[:200]}\n{cp.stdout[-3000:]}{cp.stderr[-500:]}")
        except (subprocess.TimeoutExpired, psutil.Error, OSError) as e:
            dumps.append(f"--- pid {p.pid}: no dump ({e})")
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    return "\n".join(dumps)
