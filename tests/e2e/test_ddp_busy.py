"""Busy or stuck on a real torchrun DDP job (2 ranks, gloo, CPU), no client library: a silent
evaluation is not a hang, a SIGSTOPped rank is.

The job (tests/trainer_scripts/ddp_eval_train.py) prints ``step N: loss X`` from every rank, as a plain
script does; the daemon learns the timeout from that rhythm (``step_learn_after`` 3 intervals, then
``max(learn_floor_s, 5 x longest gap)``; twice the margin before). At the defaults the case of issue 21 is a 70 s silent
eval against the 60 s floor, looked at for ``look_s`` 3 s at 60 s, so the verdict comes while the
eval still runs. Here the same mechanism is scaled down through config: ``learn_floor_s = 5``
(the steps come every ~0.06 s, so the learned timeout is the floor) and a 15 s eval, longer than
floor + look (8 s) with room for a slower learned timeout on a loaded machine; ``look_s`` stays at
its default (3 s), as does everything else.

(a) Rank 0 evaluates silently, rank 1 waits in ``dist.barrier()``: at the timeout the look sees
    rank 0 working (CPU, moving stacks) and the others waiting, so the job is busy:
    ``hang_suspected`` recorded, not stopped, the job finishes with exit 0.
(b) Rank 1 is SIGSTOPped mid-training (rank 0 then waits in ``all_reduce``): the look sees a
    stopped process, hung. The bound: SIGSTOP -> hang detection <= the learned timeout +
    ``look_s`` + 2 s (the py-spy samples, the 0.25 s heartbeat poll, the last step line printed up
    to one step before the stop, and a loaded machine); measured ~8.3 s against 5 + 3 + 2 here.
    The look's stacks file (every process, every sample) is in the ledger's detection and in
    ``history --json`` (``stacks_dumped``).
(c) Rank 1 sleeps forever before a step's all_reduce (stuck outside the collective, rank 0 waits
    in it): nobody uses CPU, hung within the same bound.
"""
from __future__ import annotations

import sys
import time
from datetime import datetime
from pathlib import Path

import psutil
import pytest

from supervisor.ops.control import ControlError, DaemonNotRunning
from supervisor.ops.controlclient import request
from tests.conftest import ROOT, history
from tests.util import wait_for

pytestmark = pytest.mark.slow

PY = sys.executable
TORCHRUN = str(Path(PY).with_name("torchrun"))
JOB = ROOT / "tests" / "trainer_scripts" / "ddp_eval_train.py"
FLOOR_S, EVAL_S, LOOK_S = 5.0, 15.0, 3.0  # look_s is the default: not in the config
SLACK_S = 2.0


def _wrap(daemons, tmp: Path, *job_args: str):
    cfg = tmp / "tsup.toml"
    cfg.write_text(f"[heartbeat]\nlearn_floor_s = {FLOOR_S}\n")
    out = tmp / "out"
    out.mkdir()
    sd = tmp / "sd"
    d = daemons(["wrap", "--config", str(cfg), "--state-dir", str(sd), "--max-restarts", "0", "--",
                 TORCHRUN, "--standalone", "--nproc-per-node=2", "--max-restarts=0", str(JOB), str(out), *job_args])
    return d, sd, out


def _status(sd: Path) -> dict | None:
    """The running daemon's status over its control socket (what ``status --json`` prints), None
    while it does not answer. Asked from this process: a CLI process per poll cost ~0.2 s of CPU."""
    try:
        return request(sd, "status", timeout=5.0)
    except (DaemonNotRunning, ControlError, OSError):
        return None


def _ranks(pids: list[int]) -> dict[int, int]:
    """rank -> pid, from the daemon's pids and their children (torchrun's workers carry RANK)."""
    out: dict[int, int] = {}
    for pid in pids:
        try:
            procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            continue
        for p in procs:
            try:
                rank = p.environ().get("RANK")
            except psutil.Error:
                continue
            if rank is not None and "ddp_eval_train.py" in " ".join(p.cmdline()):
                out[int(rank)] = p.pid
    return out


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_a_silent_eval_on_rank_0_is_busy_not_hung_and_the_job_finishes(daemons, tmp_path: Path) -> None:
    d, sd, out = _wrap(daemons, tmp_path, "--steps", "160", "--eval-every", "100", "--eval-s", str(EVAL_S))
    ranks = wait_for(lambda: len(r := _ranks((_status(sd) or {}).get("pids", []))) == 2 and r, 120,
                     interval=0.5, what="both ranks running")
    assert d.wait(180) == 0, d.stderr()[-3000:]
    h = history(sd)
    [a] = h["attempts"]
    assert a["exit_code"] == 0 and a["cause"] is None, a
    names = [e["event"] for e in h["events"]]
    assert "failure_detected" not in names and "stacks_dumped" not in names, names
    assert (out / "done-0").is_file() and (out / "done-1").is_file()

    suspected = [e for e in h["events"] if e["event"] == "hang_suspected"]
    assert suspected, names
    look = suspected[0]["data"]["look"]
    assert look["busy"] and "working: stacks moved" in look["reason"], look
    # The DDP rule: rank 0 works, rank 1 (in the barrier) and torchrun's agent wait.
    assert look["states"][str(ranks[0])] == "working", look
    assert look["states"][str(ranks[1])] == "waiting", look
    stacks = Path(suspected[0]["data"]["stacks"]).read_text()
    assert "evaluate" in stacks and "barrier" in stacks, stacks[:2000]
    # It was judged during the eval, at the learned timeout (the floor) + the look.
    started = float((out / "eval-100.start").read_text())
    ended = float((out / "eval-100.end").read_text())
    at = [datetime.fromisoformat(e["at"]).timestamp() for e in suspected]
    assert all(started + FLOOR_S <= t <= ended for t in at), (started, at, ended)
    assert at[0] - started <= FLOOR_S + LOOK_S + SLACK_S, (started, at)


def test_a_sigstopped_rank_is_hung_within_the_timeout_plus_the_look_with_stacks(daemons, tmp_path: Path) -> None:
    d, sd, out = _wrap(daemons, tmp_path, "--steps", "5000", "--eval-every", "0")

    def learned() -> dict | None:
        s = _status(sd)
        step = ((s or {}).get("last_metric") or {}).get("step") or 0
        return s if step >= 60 else None  # 20 intervals learned, then some steps at that timeout

    s = wait_for(learned, 120, interval=0.5, what="60 steps printed")
    ranks = _ranks(s["pids"])
    assert sorted(ranks) == [0, 1], (s["pids"], ranks)
    stopped_at = time.time()
    psutil.Process(ranks[1]).suspend()  # SIGSTOP
    assert d.wait(120) == 3, d.stderr()[-3000:]

    h = history(sd)
    [a] = h["attempts"]
    assert a["cause"] == "hang", a
    det = a["detection"]
    look, timeout = det["details"]["look"], float(det["details"]["timeout_s"])
    assert det["details"]["timeout_source"] == "learned" and timeout == FLOOR_S, det["details"]
    assert not look["busy"] and "stopped" in look["reason"] and str(ranks[1]) in look["reason"], look
    assert look["states"][str(ranks[1])] == "stopped" and look["states"][str(ranks[0])] == "waiting", look
    assert det["at"] - stopped_at <= timeout + LOOK_S + SLACK_S, (det["at"] - stopped_at, det["details"])
    assert "looked" in det["evidence"] and "stopped" in det["evidence"]
    # The stacks are the evidence: in the detection and in the history's stacks_dumped event.
    path = Path(det["details"]["stacks"])
    text = path.read_text()
    assert text.startswith("# hung:") and f"pid {ranks[1]}" in text and "all_reduce" in text, text[:2000]
    dumped = [e for e in h["events"] if e["event"] == "stacks_dumped"]
    assert [e["data"]["path"] for e in dumped] == [str(path)]
    # Nothing of the job is left (the stopped rank was continued and ended with the rest).
    assert wait_for(lambda: not any(_alive(p) for p in ranks.values()), 30, what="ranks gone")


def test_a_rank_asleep_before_the_collective_is_hung_within_the_timeout_plus_the_look(daemons, tmp_path: Path) -> None:
    d, sd, out = _wrap(daemons, tmp_path, "--steps", "5000", "--eval-every", "0", "--stall-at", "80")
    ranks = wait_for(lambda: len(r := _ranks((_status(sd) or {}).get("pids", []))) == 2 and r, 120,
                     interval=0.5, what="both ranks running")
    assert d.wait(180) == 3, d.stderr()[-3000:]
    [a] = history(sd)["attempts"]
    det = a["detection"]
    # The step the job had reached (stall at 80); under load the last parsed line may trail it a little.
    assert a["cause"] == "hang" and det["step"] is not None and 70 <= det["step"] <= 80, det
    look = det["details"]["look"]
    assert not look["busy"] and look["reason"].startswith("nobody works") and "no CPU" in look["reason"], look
    assert {look["states"][str(ranks[r])] for r in (0, 1)} == {"waiting"}, look
    assert det["details"]["age_s"] <= float(det["details"]["timeout_s"]) + LOOK_S + SLACK_S, det["details"]
    text = Path(det["details"]["stacks"]).read_text()
    assert "all_reduce" in text and "main (ddp_eval_train.py" in text, text[:2000]
