"""A tiny "training" job for the cluster tests (no torch): prints JSON metric lines, writes a
checkpoint file (a plain pickle) with a client manifest every SAVE steps, resumes from
TSUP_RESUME_STEP, and records every launch (the TSUP_* cluster variables) in OUT/launches.jsonl.

Usage: cluster_job.py OUT CKDIR TOTAL STEP_S SAVE [NAN_NODE NAN_STEP [BAD_NODE BAD_GEN]]
NaN is printed at NAN_STEP on node NAN_NODE in generation 1 only (its wall time in OUT/nan_at);
on node BAD_NODE in generation BAD_GEN every loss is 100 times too high (a resume gone wrong);
a SIGTERM is recorded in OUT/stops.jsonl (generation, wall time) before the job exits 143.
"""
from __future__ import annotations

import json
import os
import pickle
import signal
import sys
import time
from pathlib import Path

from supervisor.client import record_checkpoint


def main() -> None:
    out, ckdir = Path(sys.argv[1]), Path(sys.argv[2])
    total, step_s, save = int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
    nan_node, nan_step = (sys.argv[6], int(sys.argv[7])) if len(sys.argv) > 7 else ("", -1)
    bad_node, bad_gen = (sys.argv[8], int(sys.argv[9])) if len(sys.argv) > 9 else ("", -1)
    env = os.environ
    node = env.get("TSUP_NODE_ID", "")
    gen = int(env.get("TSUP_GENERATION") or int(env.get("TSUP_ATTEMPT") or 0) + 1)  # single node: by attempt
    resume = int(env["TSUP_RESUME_STEP"]) if env.get("TSUP_RESUME_STEP") else 0
    out.mkdir(parents=True, exist_ok=True)
    rec = {k: v for k, v in env.items() if k.startswith("TSUP_") or k.startswith("MASTER_")}
    with open(out / "launches.jsonl", "a") as f:
        f.write(json.dumps({**rec, "pid": os.getpid(), "at": time.time()}) + "\n")
    def on_term(_sig: int, _frame: object) -> None:  # when the stop reached this job (the bench reads it)
        with open(out / "stops.jsonl", "a") as f:
            f.write(json.dumps({"gen": gen, "at": time.time()}) + "\n")
        sys.exit(143)

    signal.signal(signal.SIGTERM, on_term)
    for step in range(resume + 1, total + 1):
        time.sleep(step_s)
        loss = float("nan") if (node == nan_node and gen == 1 and step == nan_step) else 10.0 / step
        if node == bad_node and gen == bad_gen:
            loss *= 100
        if loss != loss:
            (out / "nan_at").write_text(str(time.time()))
        print(json.dumps({"step": step, "loss": loss if loss == loss else "NaN"}).replace('"NaN"', "NaN"), flush=True)
        if step % save == 0:
            p = ckdir / f"step_{step}.pt"
            tmp = ckdir / f".step_{step}.tmp"
            # A plain pickle, as a torch save is: the daemon's pickle scan must read a .pt (one
            # it cannot read is refused, so never ready, and no step would be common to all).
            tmp.write_bytes(pickle.dumps({"node": node, "step": step}))
            os.replace(tmp, p)
            record_checkpoint(p, step=step)


if __name__ == "__main__":
    main()
