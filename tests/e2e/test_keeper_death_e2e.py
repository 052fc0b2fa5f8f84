"""kill -9 of the output keeper under the real daemon (issue 24 build 2): the job's pipes stay
open (the daemon holds their read ends and starts a new keeper on them), the job lives on and
finishes, its output still reaches job.log, and no crash is booked."""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.conftest import Daemon, history, started_daemons

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


@pytest.fixture
def supervise(tmp_path: Path) -> Iterator[Any]:
    def make(args: list[str]) -> Daemon:
        return Daemon(args, tmp_path)

    with started_daemons(make) as start:
        yield start


def keepers_of(daemon_pid: int) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().split(b"\0")
            ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == daemon_pid and any(c.endswith(b"job/keeper.py") for c in cmd):
            out.append(int(p.name))
    return out


@pytest.mark.slow
def test_kill_9_of_the_output_keeper_neither_kills_the_job_nor_counts_as_a_crash(supervise, tmp_path: Path) -> None:
    out, sd = tmp_path / "out", tmp_path / "sd"
    d = supervise(["wrap", "--state-dir", str(sd), "--checkpoint-dir", str(out), "--",
                   PY, str(ROOT / "tests" / "trainer_scripts" / "nanogpt_train.py"), f"--out_dir={out}", "--max_iters=120",
                   "--eval_interval=40", "--iter_sleep=0.05"])
    deadline = time.monotonic() + 120
    while "iter 10:" not in d.stdout():
        assert time.monotonic() < deadline and d.proc.poll() is None, d.stderr()[-3000:]
        time.sleep(0.1)
    [keeper] = keepers_of(d.proc.pid)
    os.kill(keeper, signal.SIGKILL)
    assert d.wait(180) == 0, d.stderr()[-3000:]
    assert "event=output_keeper_restarted" in d.stderr(), d.stderr()[-3000:]
    [attempt] = history(sd)["attempts"]
    assert attempt["cause"] in (None, "") and attempt["exit_code"] == 0, attempt
    logs = list(sd.rglob("job.log"))
    assert logs and "iter 119:" in logs[0].read_text(), logs
    assert "iter 119:" in d.stdout()  # still shown and parsed after the kill
