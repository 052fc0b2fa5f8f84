"""A plain PyTorch loop whose only metrics are a file it writes: ``--sink jsonl`` appends
``{"step": N, "loss": X}`` lines to ``<out_dir>/metrics.jsonl``; ``--sink tb`` writes
``train/loss`` with ``torch.utils.tensorboard.SummaryWriter`` into ``<out_dir>/tb/`` (flushed each
step, as a user who wants live curves sets it). It prints nothing per step. Faults from FAULT
(_faults.py).

    python filelog_train.py --out_dir out --sink jsonl --steps 40
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _faults import Fault


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out_dir", default="out")
    ap.add_argument("--sink", choices=["jsonl", "tb", "logfile", "loguru", "mlflow"], default="jsonl")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--step_s", type=float, default=0.1)
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    fault = Fault(args.out_dir)
    writer = None
    if args.sink == "tb":
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(os.path.join(args.out_dir, "tb"))
    jsonl = open(os.path.join(args.out_dir, "metrics.jsonl"), "a") if args.sink == "jsonl" else None
    report: Callable[[str], object] | None = None
    if args.sink == "logfile":
        import logging

        logging.basicConfig(filename=os.path.join(args.out_dir, "train.log"), level=logging.INFO,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        report = logging.getLogger("train").info
    elif args.sink == "loguru":
        from loguru import logger

        logger.remove()
        logger.add(os.path.join(args.out_dir, "train.log"), serialize=True)
        report = logger.info
    elif args.sink == "mlflow":
        import mlflow

        mlflow.start_run()
    print(f"training {args.steps} steps; metrics in {args.out_dir}")
    for step in range(1, args.steps + 1):
        x = torch.randn(16, 8)
        loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if writer is not None:
            writer.add_scalar("train/loss", loss.item(), step)
            writer.flush()
        if jsonl is not None:
            jsonl.write(json.dumps({"step": step, "loss": loss.item(), "lr": 0.05}) + "\n")
            jsonl.flush()
        if report is not None:
            report(f"step {step} loss={loss.item():.4f} lr=0.05")
        if args.sink == "mlflow":
            mlflow.log_metric("train_loss", loss.item(), step=step)
        fault.inject(step, list(model.parameters()))
        time.sleep(args.step_s)
    print("done")


if __name__ == "__main__":
    main()
