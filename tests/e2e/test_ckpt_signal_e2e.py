"""Issue 34 through the real daemon: the divergence precursor's checkpoint request never kills an
unmodified job. A job with no SIGUSR1 handler (SIGUSR1's default action ends it) is not sent the
signal: it runs to its end (exit 0, one attempt) and the not-sent event says why; a job with a
handler is still sent it and saves."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import history

PY = sys.executable
JOB = """import signal, sys, time
from pathlib import Path
out = Path(sys.argv[1])
if sys.argv[2] == "handler":
    signal.signal(signal.SIGUSR1, lambda *a: out.joinpath("saved").write_text("1"))
for i in range(300):
    g = 4.0 if 150 <= i <= 152 else 1.0 + 0.01 * (i % 7)
    print(f"step {i} loss {2 - i * 0.001:.4f} grad_norm {g}", flush=True)
    time.sleep(0.01)
"""


def _run(daemons, tmp_path: Path, mode: str) -> tuple[int, dict, Path]:
    sd, job, out = tmp_path / "sd", tmp_path / "job.py", tmp_path / "out"
    out.mkdir()
    job.write_text(JOB)
    d = daemons(["wrap", "--state-dir", str(sd), "--set", "job.prewarm=false", "--set", "gpu.backend=none",
                 "--", PY, str(job), str(out), mode])
    rc = d.wait(120)
    return rc, history(sd), out


@pytest.mark.slow
def test_a_job_without_a_handler_is_not_killed_by_the_checkpoint_request(daemons, tmp_path: Path) -> None:
    rc, h, _ = _run(daemons, tmp_path, "plain")
    names = [e["event"] for e in h["events"]]
    assert rc == 0, h["events"][-5:]
    assert len(h["attempts"]) == 1 and "divergence_precursor" in names
    [ev] = [e for e in h["events"] if e["event"] == "checkpoint_request_not_sent"]
    assert "does not handle SIGUSR1" in ev["message"] and "client" in ev["message"]
    assert "checkpoint_requested" not in names  # the machine never sent it


@pytest.mark.slow
def test_a_job_with_a_handler_is_still_sent_the_request_and_saves(daemons, tmp_path: Path) -> None:
    rc, h, out = _run(daemons, tmp_path, "handler")
    names = [e["event"] for e in h["events"]]
    assert rc == 0, h["events"][-5:]
    assert "checkpoint_requested" in names and "checkpoint_request_not_sent" not in names
    assert (out / "saved").read_text() == "1"
