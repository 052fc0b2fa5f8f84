"""``wrap`` on a real terminal (a pty): the console reads like the demo's narration, and the job's
own lines stay whole between the daemon's sentences."""
from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import ROOT

JOB = """
import os, time
first = not os.path.exists("mark")
open("mark", "a").close()
for s in range(1, 8):
    nan = first and s == 5
    print(f"step {s} loss {'nan' if nan else 2.0 - s / 10}", flush=True)
    if nan:
        time.sleep(60)  # stopped by the daemon
"""


def read_pty(fd: int, proc: subprocess.Popen, timeout: float) -> str:
    """Everything the pty shows until the process exits (or the deadline: the test then fails)."""
    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the last writer closed the terminal
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    else:
        proc.kill()
        raise AssertionError(f"wrap did not end within {timeout} s; the console so far:\n{out.decode()}")
    return out.decode(errors="replace").replace("\r\n", "\n")


def test_wrap_on_a_terminal_narrates_like_the_demo(tmp_path: Path):
    (tmp_path / "job.py").write_text(JOB)
    master, slave = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("JOURNAL_STREAM", None)
    proc = subprocess.Popen([sys.executable, "-m", "supervisor", "wrap", "--state-dir", str(tmp_path / "st"),
                             "--backoff", "0", "--grace", "2", "--", sys.executable, "job.py"],
                            stdin=slave, stdout=slave, stderr=slave, cwd=str(tmp_path), env=env)
    os.close(slave)
    try:
        console = read_pty(master, proc, timeout=120)
    finally:
        os.close(master)
    assert proc.wait(timeout=30) == 0, console
    lines = console.splitlines()
    stamped = re.compile(r"^\[\d\d:\d\d:\d\d\] ")
    # The demo's sentences, in order: launched, detected with evidence and decision, launched again.
    first = lines.index(next(l for l in lines if ">> attempt 0 launched, from scratch" in l))
    det = next(i for i, l in enumerate(lines) if "!! detected nan at step 5 (seen in stdout)" in l)
    assert first < det and stamped.match(lines[det]), console
    assert lines[det + 1].strip() == "evidence: step 5 loss nan", console
    # (an "anomaly began at step N" line may come between when the onset is earlier)
    decision = next(l.strip() for l in lines[det + 2:det + 4] if l.strip().startswith("decision: "))
    assert "rollback" in decision, console
    assert any(">> attempt 1 launched" in l for l in lines[det:]), console
    assert "== finished: the job exited 0 after" in console, console  # with what was watched (core/runend.py)
    # Every other event compactly, never structlog's dev renderer or a Python list repr.
    assert not any("event=" in l or "['" in l for l in lines), console
    # The job's lines are whole, each on a line of its own.
    job_lines = [l for l in lines if not stamped.match(l) and not l.startswith(" ")]
    assert job_lines == [f"step {s} loss {2.0 - s / 10}" for s in range(1, 5)] + ["step 5 loss nan"] + \
        [f"step {s} loss {2.0 - s / 10}" for s in range(1, 8)], console
