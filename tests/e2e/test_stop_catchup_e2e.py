"""Through the real daemon: a stop ends on time even when the daemon is far behind the job's output
(issue 34, defect SG). The job floods 64 KiB lines on stdout and stderr faster than the daemon
parses them (the keeper writes job.log at the job's speed and leaves the backlog there for the
daemon to read back) and ignores SIGTERM. The daemon gets SIGTERM with ``--grace 2``: the job is
SIGKILLed at 2 s, then the daemon reads on for at most STOP_CATCH_UP_MIN_S (the grace is used up),
says ``output_catch_up_cut`` with the bytes it leaves unread in job.log, records the attempt's end
and exits 143. Unbounded, it read the whole backlog back first (26 s after a SIGTERM, 81 s after a
``stop``), and a scheduler's KillWait (30 s) SIGKILLed it before the run's end was recorded.
"""
from __future__ import annotations

import re
import signal
import sys
import time
from pathlib import Path

import pytest

from supervisor.daemon.jobstop import STOP_CATCH_UP_MIN_S
from tests.conftest import history
from tests.util import wait_for

PY = sys.executable
GRACE_S = 2.0
BACKLOG = 512 << 20  # bytes in job.log the daemon has not passed on yet when it is stopped

FLOOD_JOB = """\
import os, signal, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the grace runs out: SIGKILL
for s in range(1, 6):
    print(f"step {s} loss 1.0", flush=True)
line = b"x" * 65535 + b"\\n"
while True:
    os.write(1, line)
    os.write(2, line)
"""


def _backlog(sd: Path, tmp: Path) -> int:
    """job.log's bytes (rotated ones too) less what the daemon passed on to its own stdout and
    stderr: the output it has not handled yet (its journal lines on stderr are a few kB)."""
    written = sum(p.stat().st_size for p in sd.glob("job.log*"))
    passed = sum(p.stat().st_size for p in (tmp / "daemon.stdout", tmp / "daemon.stderr") if p.exists())
    return written - passed


def _event_line(path: Path, name: str) -> str | None:
    """The journal line of ``name`` among the job's 64 KiB lines the daemon passed through (a
    chunk of the job's stderr may end mid-line: the journal line is looked for anywhere in one)."""
    head = f"event={name} ".encode()
    with open(path, "rb") as f:
        for line in f:
            if (at := line.find(head)) >= 0:
                return line[at:].decode(errors="replace")
    return None


@pytest.mark.slow
def test_sigterm_with_a_flood_behind_ends_within_the_grace_and_the_bound(daemons, tmp_path: Path) -> None:
    sd, job = tmp_path / "sd", tmp_path / "job.py"
    job.write_text(FLOOD_JOB)
    d = daemons(["wrap", "--state-dir", str(sd), "--set", "gpu.backend=none", "--set", "job.prewarm=false",
                 "--set", "host.storage_probe=false", "--grace", str(GRACE_S), "--", PY, str(job)])
    wait_for(lambda: d.proc.poll() is not None or _backlog(sd, tmp_path) >= BACKLOG, timeout=120, interval=0.05)
    assert d.proc.poll() is None, d.stderr()[-3000:]
    t0 = time.monotonic()
    d.signal(signal.SIGTERM)
    rc = d.wait(120)
    took = time.monotonic() - t0
    # The grace, the bound, and a margin for a loaded 2-core machine (the kill, the ledger, the exit).
    # Without the bound the daemon read the whole backlog back first: 20-80 s here.
    assert took < GRACE_S + STOP_CATCH_UP_MIN_S + 8, f"the daemon exited {took:.1f} s after SIGTERM"
    assert rc == 143, d.stderr()[-3000:]
    cut = _event_line(tmp_path / "daemon.stderr", "output_catch_up_cut")
    assert cut is not None, "no output_catch_up_cut event"
    m = re.search(r"unread_bytes=(\d+)", cut)
    assert m is not None and int(m.group(1)) > 0, cut
    assert "job.log" in cut and "nothing is lost" in cut, cut
    assert _event_line(tmp_path / "daemon.stderr", "output_caught_up") is None  # it was not
    h = history(sd)
    assert (h["state"], h["exit_code"]) == ("stopped", 143), h
    [attempt] = h["attempts"]
    assert attempt["ended_at"] is not None and attempt["shutdown"]["escalated"] is True, attempt
    # Nothing is lost: the bytes the daemon left unread (the newest) are in job.log and its rotated
    # copies (the oldest copies may have been rotated away by [job] log_keep, as documented).
    logs = list(sd.glob("job.log*"))
    assert sum(p.stat().st_size for p in logs) >= int(m.group(1)), logs
