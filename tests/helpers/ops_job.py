"""A tiny supervised job for the systemd tests (no torch): prints steps, fails on request,
flushes a "checkpoint" on SIGTERM.

Files in $OPS_DIR (default: the working directory):
  launches            one line per start: "<attempt> <pid>" (how many copies ever ran)
  fail                if present at a step, the job deletes it and exits 1 (a crash)
  stop.<attempt>      written on SIGTERM, after the checkpoint flush: "flushed step=<n>"
  flush_delay         if present: seconds the flush takes (a big checkpoint being saved)
Checkpoints go to $TSUP_CHECKPOINT_DIR/step_<n>.ckpt (atomic: temp + rename).
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

ops = Path(os.environ.get("OPS_DIR", "."))
attempt = os.environ.get("TSUP_ATTEMPT", "?")
ckpt_dir = Path(os.environ.get("TSUP_CHECKPOINT_DIR") or ops / "ckpt")
step = 0
stop_requested = False


def on_term(signum: int, frame: object) -> None:
    global stop_requested
    stop_requested = True  # flushed at the next step boundary, as a real training loop does


def flush_checkpoint() -> Path:
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    path = ckpt_dir / f"step_{step}.ckpt"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"step": step, "attempt": attempt}))
    os.replace(tmp, path)
    return path


def on_usr1(signum: int, frame: object) -> None:
    global checkpoint_requested
    checkpoint_requested = True


checkpoint_requested = False
signal.signal(signal.SIGTERM, on_term)
signal.signal(signal.SIGUSR1, on_usr1)  # the emergency-checkpoint signal: save, keep going
with open(ops / "launches", "a") as f:
    f.write(f"{attempt} {os.getpid()}\n")
print(f"ops_job started attempt={attempt} pid={os.getpid()} resume={os.environ.get('TSUP_RESUME_FROM', '')}",
      flush=True)
while True:
    step += 1
    print(json.dumps({"step": step, "loss": round(4.0 / step ** 0.5, 4)}), flush=True)
    if (ops / "fail").exists():
        (ops / "fail").unlink()
        print("ops_job: simulated failure, exiting 1", file=sys.stderr, flush=True)
        sys.exit(1)
    if checkpoint_requested and not stop_requested:
        checkpoint_requested = False
        print(f"ops_job: emergency checkpoint {flush_checkpoint()}", flush=True)
    if stop_requested:
        delay = ops / "flush_delay"
        if delay.exists():
            print(f"ops_job: saving a big checkpoint ({delay.read_text().strip()} s)", flush=True)
            time.sleep(float(delay.read_text()))
        path = flush_checkpoint()
        (ops / f"stop.{attempt}").write_text(f"flushed step={step} path={path}\n")
        print(f"ops_job: SIGTERM received, checkpoint flushed to {path}, exiting", flush=True)
        sys.exit(0)
    time.sleep(0.3)
