"""Where a torchrun job's restart time goes (issue 38 part 4), from timestamps the job takes.

The job: 2 gloo ranks on the CPU (``torchrun --standalone --nproc-per-node=2 --max-restarts=0``, as
docs/multinode.md tells a torchrun user to run it under ``wrap``), a step = an all-reduce + 50 ms;
rank 0 saves a BENCH_TORCHRUN_CKPT_MB state dict at step 2 (outside the working tree: no checkpoint
dir is given to the daemon); rank 1 SIGKILLs itself at step 5 of the first attempt. The restarted
attempt loads that checkpoint on both ranks, as a DDP job resuming does. Each rank of each attempt
writes, by wall clock: the agent's start (torchrun run as its own two-line console script, after
a first line that stamps the time), its own first line, the end of ``import torch`` (+ torch.distributed), the end of
``init_process_group`` (the rendezvous), the end of the checkpoint load and its first step. The
restart, fault -> the restarted attempt's first step, splits into:

- fault -> the new agent's start: torchrun's teardown of the surviving rank, its exit, the
  daemon's decision and spawn (ours); for the peer, torchrun restarting in its own agent
  (``--max-restarts=1``, no supervisor), the agent does not restart: this part is its teardown
  and re-rendezvous of the agent, until its new workers start;
- the agent's start -> its workers' processes (torchrun's own imports and the c10d store);
- the worker's start -> torch imported (the interpreter and ``import torch``);
- -> the rendezvous done (``init_process_group``: every rank must arrive, so the slowest rank's
  imports count here for the others);
- -> the checkpoint loaded; -> the first step.

Each part is the median over BENCH_TORCHRUN_REPS runs of the slowest rank's time (the step waits
for every rank). Nothing here is a standby: what one could take off each part is written in
BENCHMARKS.md's method notes, not built.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PY = sys.executable
ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = str(Path(PY).with_name("torchrun"))
REPS = int(os.environ.get("BENCH_TORCHRUN_REPS", "3"))
CKPT_MB = int(os.environ.get("BENCH_TORCHRUN_CKPT_MB", "64"))

JOB = """\
import os, sys, time, json
t_self = time.time()
out, ckpt, mb = sys.argv[1], sys.argv[2], int(sys.argv[3])
attempt = int(os.environ.get("TSUP_ATTEMPT") or os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)
rank = int(os.environ["RANK"])

stamps = {"agent": float(os.environ["BENCH_AGENT_T"]), "worker": t_self}
def stamp(key):
    stamps[key] = time.time()
    with open(os.path.join(out, f"a{attempt}-r{rank}.json"), "w") as f:
        json.dump(stamps, f)

import torch, torch.distributed as dist
stamp("imported")
dist.init_process_group("gloo")
stamp("rendezvous")
start = 0
if os.path.exists(ckpt):
    state = torch.load(ckpt, weights_only=True)
    start = int(state["step"]) + 1
    stamp("loaded")
for step in range(start, 8):
    t = torch.ones(1024)
    dist.all_reduce(t)
    if step == start:
        stamp("first_step")
    print(f"iter {step}: loss {3 - step / 10:.4f}, time 50.00ms, mfu 1.00%", flush=True)
    if step == 2 and rank == 0 and attempt == 0:
        torch.save({"step": step, "w": torch.zeros(mb * 2**18)}, ckpt + ".tmp")
        os.replace(ckpt + ".tmp", ckpt)
    dist.barrier()
    if step == 4 and rank == 1 and attempt == 0:
        stamp("fault")
        os.kill(os.getpid(), 9)
    time.sleep(0.05)
dist.destroy_process_group()
"""

# torchrun itself (its console script is these two lines), stamping its start for its workers:
# /proc's process start times are read against a boot time that need not agree with time.time().
AGENT = """\
import os, sys, time
os.environ["BENCH_AGENT_T"] = repr(time.time())
from torch.distributed.run import main
sys.exit(main())
"""

PARTS = (("agent", "fault -> the new agent's process start (teardown, exit, decision, spawn)"),
         ("worker", "agent start -> its workers' first line (torchrun's imports, the c10d store, the workers' "
                    "interpreters)"),
         ("imported", "-> torch imported in the workers (import torch, torch.distributed)"),
         ("rendezvous", "-> rendezvous done (init_process_group; waits for the slowest rank)"),
         ("loaded", f"-> the job's checkpoint loaded ({CKPT_MB} MB state dict, both ranks)"),
         ("first_step", "-> the first step (an all-reduce)"))


def _one(tmp: Path, arm: str) -> dict[str, float]:
    out, ck = tmp / "out", tmp / "ck"
    out.mkdir()
    ck.mkdir()
    job = tmp / "job.py"
    job.write_text(JOB)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    restarts = "0" if arm == "ours" else "1"
    agent = tmp / "torchrun_stamped.py"
    agent.write_text(AGENT)
    cmd = [PY, str(agent), "--standalone", "--nproc-per-node=2", f"--max-restarts={restarts}", str(job), str(out),
           str(ck / "ckpt.pt"), str(CKPT_MB)]
    if arm == "ours":
        cmd = [PY, "-m", "supervisor", "wrap", "--state-dir", str(tmp / "sd"), "--", *cmd]
    work = tmp / "work"
    work.mkdir()
    p = subprocess.run(cmd, cwd=work, env={**env, "PYTHONPATH": str(ROOT)} if arm == "ours" else env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=600)
    assert p.returncode == 0, f"{arm}: exit {p.returncode}: {p.stderr.decode(errors='replace')[-3000:]}"
    fault = json.loads((out / "a0-r1.json").read_text())["fault"]
    ranks = [json.loads((out / f"a1-r{r}.json").read_text()) for r in (0, 1)]
    parts: dict[str, float] = {}
    prev = fault
    for key, _ in PARTS:
        # The slowest rank: the step waits for every one. torchrun restarting in its own agent keeps
        # the agent (started before the fault): that part is 0 and the next counts from the fault.
        at = max(max(r[key] for r in ranks), prev)
        parts[key] = at - prev
        prev = at
    parts["total"] = prev - fault
    return parts


def run() -> list[dict]:
    got: dict[str, list[dict[str, float]]] = {"ours": [], "torchrun": []}
    failed: dict[str, list[str]] = {"ours": [], "torchrun": []}
    i = 0
    # A run that fails is counted and said, and another one takes its place (at most 2 x REPS
    # tries an arm): torchrun's in-agent restart on gloo can fail to connect its new workers.
    while any(len(got[a]) < REPS and len(got[a]) + len(failed[a]) < 2 * REPS for a in got):
        for arm in (("ours", "torchrun") if i % 2 == 0 else ("torchrun", "ours")):
            if len(got[arm]) >= REPS or len(got[arm]) + len(failed[arm]) >= 2 * REPS:
                continue
            with tempfile.TemporaryDirectory(prefix=f"bench-torchrun-{arm}-") as d:
                try:
                    got[arm].append(_one(Path(d), arm))
                except AssertionError as e:
                    last = [ln for ln in str(e).splitlines() if "Error" in ln]
                    failed[arm].append(last[0][:160] if last else str(e)[:160])
        i += 1
    for arm in got:
        assert got[arm], f"{arm}: every run failed: {failed[arm][:1]}"
    said = "; ".join(f"{a}: {len(f)} failed ({f[0]})" for a, f in failed.items() if f) or "none failed"
    med = {arm: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for arm, rs in got.items()}
    rows: list[dict] = [{"name": f"settings: 2 gloo ranks on the CPU, torchrun --standalone --nproc-per-node=2; ours: wrap at "
                         f"the defaults around --max-restarts=0 (the daemon restarts the whole torchrun); peer: torchrun "
                         f"--max-restarts=1 alone (it restarts the workers in its agent); rank 1 SIGKILLs itself at step "
                         f"4; the slowest rank's stamps, medians of the interleaved runs that finished (ours "
                         f"{len(got['ours'])} of {len(got['ours']) + len(failed['ours'])}, the peer {len(got['torchrun'])} of "
                         f"{len(got['torchrun']) + len(failed['torchrun'])}); failed runs: {said}", "value": "", "unit": "",
                         "target": ""}]
    for key, what in PARTS:
        rows.append({"id": f"torchrun-restart-{key}", "name": f"torchrun restart, ours: {what}",
                     "value": round(med["ours"][key], 2), "unit": "s", "target": "report"})
        rows.append({"name": "same part, torchrun restarting in its own agent (peer)",
                     "value": round(med["torchrun"][key], 2), "unit": "s", "target": "peer"})
    rows.append({"id": "torchrun-restart-total", "name": "torchrun restart, ours: fault -> the first step, in all",
                 "value": round(med["ours"]["total"], 2), "unit": "s", "target": "report"})
    rows.append({"name": "same, torchrun restarting in its own agent (peer)", "value": round(med["torchrun"]["total"], 2),
                 "unit": "s", "target": "peer"})
    return rows


if __name__ == "__main__":
    for r in run():
        print(r)
