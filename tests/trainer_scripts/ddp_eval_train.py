"""A plain torchrun DDP job (gloo, CPU) with silent evaluations: what an unmodified script does.

No supervisor import, no TSUP_* variable read. Every rank trains a tiny linear model (one
all_reduce of the gradients per step) and prints ``step N: loss X`` as a plain script would.
Every ``--eval-every`` steps rank 0 evaluates for ``--eval-s`` seconds without printing a line
(a validation loop computing on CPU), while the other ranks wait for it in ``dist.barrier()``;
then every rank prints its ``eval step N: val_loss X`` line and training goes on. When rank 0
reaches the first eval it writes ``OUT/eval-<step>.start`` (and ``.end`` after), so a test can
say when the silence began. ``--stall-at N``: rank 1 sleeps forever before step N's all_reduce.

Usage: ddp_eval_train.py OUT --steps N --step-s S --eval-every K --eval-s E [--stall-at N]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.distributed as dist


def evaluate(model: torch.nn.Module, seconds: float) -> float:
    """Forward passes over fresh batches for ``seconds``: CPU-bound and its stack moves (the
    forward, the loss, the batch maker), as a real validation loop's does."""
    end = time.monotonic() + seconds
    total, n = 0.0, 0
    with torch.no_grad():
        while time.monotonic() < end:
            x = torch.randn(256, 64)
            total += float(torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True)))
            n += 1
    return total / max(1, n)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--step-s", type=float, default=0.05)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--eval-s", type=float, default=7.0)
    ap.add_argument("--stall-at", type=int, default=0, help="rank 1 sleeps forever before this step's all_reduce")
    a = ap.parse_args()
    out = Path(a.out)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step in range(1, a.steps + 1):
        x = torch.randn(32, 64)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        if step == a.stall_at and rank == 1:
            time.sleep(3600)  # a rank stuck outside the collective: the others wait in it for good
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        opt.step()
        print(f"step {step}: loss {loss.item():.4f}", flush=True)
        time.sleep(a.step_s)
        if a.eval_every and step % a.eval_every == 0 and step < a.steps:
            if rank == 0:
                (out / f"eval-{step}.start").write_text(str(time.time()))
                val = evaluate(model, a.eval_s)
                (out / f"eval-{step}.end").write_text(str(time.time()))
            dist.barrier()  # the other ranks wait here, silent, for rank 0's evaluation
            if rank == 0:
                print(f"eval step {step}: val_loss {val:.4f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    (out / f"done-{rank}").write_text(str(step))


if __name__ == "__main__":
    main()
