"""torchrun under the supervisor, as documented: restarts outside (ours), none inside
(``--max-restarts=0``). A rank that crashes ends torchrun's agent with a non-zero status, and the
supervisor relaunches the exact torchrun command, resumed; a SIGTERM to the daemon reaches the
ranks through the agent and the daemon exits 143."""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from tests.conftest import history
from tests.util import wait_for

pytestmark = pytest.mark.slow

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))

JOB = """\
import os, sys, time
out = sys.argv[1]
resume = sys.argv[2] if len(sys.argv) > 2 else None
attempt = os.environ["TSUP_ATTEMPT"]
rank = os.environ["RANK"]
import torch
start = int(torch.load(resume, weights_only=True)["step"]) + 1 if resume else 0
for step in range(start, 12):
    print(f"iter {step}: loss {3 - step / 10:.4f}, time 1.00ms, mfu 1.00%", flush=True)
    if rank == "0" and step % 3 == 0:
        torch.save({"step": step}, os.path.join(out, "ckpt.tmp"))
        os.replace(os.path.join(out, "ckpt.tmp"), os.path.join(out, "step_%03d.pt" % step))
    if step == 7 and attempt == "0" and rank == "1":
        sys.exit(1)  # rank crash: torchrun (max-restarts 0) gives up, so do we restart it
    if os.environ.get("HOLD") and step == 5:
        open(os.path.join(out, "holding"), "w").close()
        time.sleep(600)
open(os.path.join(out, f"done-{rank}"), "w").write(attempt)
"""


def _cmd(tmp: Path) -> list[str]:
    job = tmp / "job.py"
    job.write_text(JOB)
    return [TORCHRUN, "--standalone", "--nproc-per-node=2", "--max-restarts=0", str(job), str(tmp)]


def test_rank_crash_under_torchrun_is_restarted_outside_and_resumed(daemons, tmp_path: Path) -> None:
    sd = tmp_path / "sd"
    d = daemons(["wrap", "--state-dir", str(sd), "--checkpoint-dir", str(tmp_path), "--backoff", "0",
                 "--resume-arg={checkpoint}", "--", *_cmd(tmp_path)])
    assert d.wait(180) == 0
    attempts = history(sd)["attempts"]
    assert [a["cause"] for a in attempts] == ["crash", None]
    # [job] prewarm is on by default; a per-node launcher is no plain Python job: cold, said why.
    assert {a["prewarm"] for a in attempts} == {"cold: not a plain Python job (torchrun is not a Python interpreter)"}
    assert attempts[1]["argv"][:len(_cmd(tmp_path))] == attempts[0]["argv"]  # the exact torchrun command
    # Resumed from the newest checkpoint written before the crash tore the ranks down (rank 0 may
    # have reached step 9 by then).
    resumed = Path(attempts[1]["argv"][-1]).name
    assert resumed in ("step_006.pt", "step_009.pt") and attempts[1]["resume_step"] in (6, 9)
    assert (tmp_path / "done-0").read_text() == "1" and (tmp_path / "done-1").read_text() == "1"


def test_sigterm_reaches_the_ranks_through_torchrun_and_the_daemon_exits_143(daemons, tmp_path: Path) -> None:
    sd = tmp_path / "sd"
    d = daemons(["wrap", "--state-dir", str(sd), "--grace", "20", "--", *_cmd(tmp_path)], env={"HOLD": "1"})
    wait_for(lambda: (tmp_path / "holding").exists(), 90, what="ranks running")
    os.kill(d.proc.pid, signal.SIGTERM)
    assert d.wait(60) == 143
    a = history(sd)["attempts"][0]
    assert a["cause"] is None or a["cause"] == "manual" or a["action"] is None
