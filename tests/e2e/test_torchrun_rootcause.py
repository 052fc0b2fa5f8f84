"""torchrun's root cause in the evidence (issue 23, Build 5): each attempt gets a
TORCHELASTIC_ERROR_FILE in the state dir; when a rank of a real 2-process gloo job raises, the
failing rank, its exception, message and last frame are in the attempt's detection, `history`
(human and --json) and the report. Without ``@record`` (issue 37 part 6; most scripts) the same
comes from the output: the rank and exit code from torchrun's summary, the exception and last
frame from that rank's traceback."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, history

pytestmark = pytest.mark.slow

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))

JOB = """\
import os, sys, time
import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for step in range(1, 6):
        t = torch.ones(4)
        dist.all_reduce(t)
        print(f"step {step} loss {3 - step / 10:.4f}", flush=True)
        if step == 3 and rank == 1:
            raise ValueError("boom at step 3")
        if step == 3:
            time.sleep(120)  # rank 0 is in a long step without a collective when rank 1 fails


if __name__ == "__main__":
    main()
"""


def test_a_failing_rank_s_exception_is_the_attempt_s_root_cause(daemons, tmp_path: Path) -> None:
    job = tmp_path / "job.py"
    job.write_text(JOB)
    sd = tmp_path / "sd"
    d = daemons(["wrap", "--state-dir", str(sd), "--max-restarts", "0", "--",
                 TORCHRUN, "--standalone", "--nproc-per-node=2", "--max-restarts=0", str(job)])
    assert d.wait(90) == 3, d.stderr()[-3000:]  # a crash with no restart left: gave up
    (a,) = history(sd)["attempts"]
    assert (sd / "torchelastic" / "attempt-0" / "error.json").is_file()
    assert a["argv"][0] == TORCHRUN and a["cause"] == "crash"
    rc = a["root_cause"]
    assert rc is not None, a["detection"]
    assert rc["rank"] == 1 and rc["exception"] == "ValueError" and rc["message"] == "boom at step 3", rc
    assert rc["last_frame"] is not None and rc["last_frame"].startswith(f"{job}:16 in main"), rc
    assert a["detection"]["details"]["root_cause"] == rc
    assert f"rank 1 raised ValueError: boom at step 3 (at {job}:16 in main)" in a["summary"]

    human = subprocess.run([sys.executable, "-m", "supervisor", "history", "--state-dir", str(sd)], cwd=str(ROOT),
                           capture_output=True, text=True, timeout=60)
    assert human.returncode == 0, human.stderr
    assert "rank 1 raised ValueError: boom at step 3" in human.stdout and f"{job}:16" in human.stdout

    rep = subprocess.run([sys.executable, "-m", "supervisor", "report", "--state-dir", str(sd),
                          "--out", str(tmp_path / "report")], cwd=str(ROOT), capture_output=True, text=True,
                         timeout=120)
    assert rep.returncode == 0, rep.stderr
    page = next((tmp_path / "report").glob("*.html")).read_text()
    assert "root cause" in page and "rank 1 raised ValueError: boom at step 3" in page and f"{job}:16" in page


def test_without_record_the_rank_exception_and_last_frame_come_from_the_output(daemons, tmp_path: Path) -> None:
    job = tmp_path / "job.py"
    job.write_text(JOB.replace("from torch.distributed.elastic.multiprocessing.errors import record\n", "")
                   .replace("@record\n", ""))
    assert "record" not in job.read_text()
    sd = tmp_path / "sd"
    d = daemons(["wrap", "--state-dir", str(sd), "--max-restarts", "0", "--",
                 TORCHRUN, "--standalone", "--nproc-per-node=2", "--max-restarts=0", str(job)])
    assert d.wait(90) == 3, d.stderr()[-3000:]
    (a,) = history(sd)["attempts"]
    assert not (sd / "torchelastic" / "attempt-0" / "error.json").exists()  # nothing from @record
    rc = a["root_cause"]
    assert rc is not None, (a["detection"], d.stderr()[-3000:])
    # The rank's exit code as torchrun's summary says it: 1, or -6 when the raising rank's gloo
    # process group aborts the interpreter on its way out (seen on a loaded machine).
    summary = (sd / "job.log").read_text(errors="replace").split("Root Cause (first observed failure)")[-1]
    code = int(re.search(r"exitcode\s*:\s*(-?\d+)", summary)[1])  # type: ignore[index]
    assert rc["source"] == "output" and rc["rank"] == 1 and rc["error_code"] == code, (rc, summary)
    assert rc["exception"] == "ValueError" and rc["message"] == "boom at step 3", rc
    assert rc["last_frame"] == f"{job}:14 in main", rc
    line = f"rank 1 raised ValueError: boom at step 3 (at {job}:14 in main)"
    assert line in a["summary"] and a["detection"]["details"]["root_cause"] == rc

    human = subprocess.run([sys.executable, "-m", "supervisor", "history", "--state-dir", str(sd)], cwd=str(ROOT),
                           capture_output=True, text=True, timeout=60)
    assert human.returncode == 0 and line in human.stdout, human.stdout + human.stderr
    rep = subprocess.run([sys.executable, "-m", "supervisor", "report", "--state-dir", str(sd),
                          "--out", str(tmp_path / "report")], cwd=str(ROOT), capture_output=True, text=True,
                         timeout=120)
    assert rep.returncode == 0, rep.stderr
    page = next((tmp_path / "report").glob("*.html")).read_text()
    assert "root cause" in page and line in page
