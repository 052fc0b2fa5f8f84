"""The stand-in training job of the Slurm test: a tiny torch model trained with the client
library, so a stop (the SIGTERM Slurm's ``--signal`` sends, passed on by the supervisor) is
answered with an emergency checkpoint at the current step and a clean exit.

It saves nothing else: the only checkpoint the supervisor can resume from is the emergency one.
``--resume=PATH`` (the supervisor's ``--resume-arg=--resume={checkpoint}``) loads it with
``weights_only=True`` and trains on to ``--steps-after-resume`` steps past the first resume and
finishes (exit 0), so the requeued run ends on its own (or a later one, when Slurm's next warning
comes first). The test reads what it prints.

    python client_job.py [--resume=PATH] [--steps-after-resume=N] [--step-s=SECONDS]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from supervisor import client

client.install()  # before torch's slow import: a stop that comes during it is served at step 1
import torch  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--resume", default=None)
    p.add_argument("--steps-after-resume", type=int, default=20)
    p.add_argument("--step-s", type=float, default=0.05)
    a = p.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step, last = 0, None
    if a.resume:
        state = torch.load(a.resume, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = int(state["step"])
        # The first resume sets the end and every later checkpoint carries it: a run that is
        # signalled again before it gets there still brings the end closer (one step at least).
        last = int(state.get("last") or step + a.steps_after_resume)
        print(f"resumed from {a.resume} at step {step}", flush=True)
    ckpt_dir = os.environ["TSUP_CHECKPOINT_DIR"]
    print(f"training from step {step} (attempt {client.resume_info().attempt})", flush=True)
    while last is None or step < last:
        x = torch.randn(8, 4)
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        client.heartbeat(step)
        client.report(step, loss=loss.item())
        if client.should_stop():
            path = os.path.join(ckpt_dir, f"step_{step}.pt")
            with client.checkpointing():
                client.save_checkpoint({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                                        "last": last}, path, step=step)
            print(f"emergency checkpoint {path} at step {step}", flush=True)
            return 0
        time.sleep(a.step_s)
    print(f"finished at step {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
