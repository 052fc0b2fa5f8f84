"""A tiny DDP job (gloo, CPU) for the two-node torchrun test: one all_reduce per step, a JSON
metric line per step, a checkpoint file with a client manifest every 10 steps in
TSUP_CHECKPOINT_DIR, resumes from TSUP_RESUME_STEP; the rank on node 1 crashes at CRASH_AT in
generation 1. Every launch is recorded in OUT/launches.jsonl.

Usage: ddp_job.py OUT TOTAL CRASH_AT
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from supervisor.client import record_checkpoint


def main() -> None:
    out, total, crash_at = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    env = os.environ
    node_rank, gen = int(env["TSUP_NODE_RANK"]), int(env["TSUP_GENERATION"])
    ck = Path(env["TSUP_CHECKPOINT_DIR"])
    resume = int(env["TSUP_RESUME_STEP"]) if env.get("TSUP_RESUME_STEP") else 0
    dist.init_process_group("gloo")
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "launches.jsonl", "a") as f:
        f.write(json.dumps({"gen": gen, "node_rank": node_rank, "rank": dist.get_rank(),
                            "world": dist.get_world_size(), "resume": resume, "at": time.time()}) + "\n")
    for step in range(resume + 1, total + 1):
        t = torch.ones(1)
        dist.all_reduce(t)
        if node_rank == 1 and gen == 1 and step == crash_at:
            print(f"rank {dist.get_rank()} crashing at step {step}", flush=True)
            os._exit(1)
        print(json.dumps({"step": step, "loss": 1.0 / step, "world": int(t.item())}), flush=True)
        time.sleep(0.05)
        if step % 10 == 0:
            p = ck / f"step_{step}.pt"
            tmp = ck / f".step_{step}.tmp"
            # A real torch save: the daemon's pickle scan must read a .pt (one it cannot read is
            # refused, so never ready, and no step would be common to both nodes).
            torch.save({"node_rank": node_rank, "step": step}, tmp)
            os.replace(tmp, p)
            record_checkpoint(p, step=step)
    dist.barrier()
    dist.destroy_process_group()
    with open(out / "done", "a") as f:
        f.write(f"{gen}\n")


if __name__ == "__main__":
    main()
