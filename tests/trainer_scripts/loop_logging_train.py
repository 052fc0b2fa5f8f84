"""A plain PyTorch loop that reports through ``logging`` with a default asctime format, as many
hand-written scripts do:

    2026-12-03 21:06:25,513 INFO trainer: epoch 0 | iter 60/300 | train_loss=2.4150 | lr=0.05

(on stderr, logging's default stream), a checkpoint ``step_<N>.pt`` (model, optimizer, step N =
optimizer steps done) every ``--save_every`` steps into ``--out_dir``, written to a temp name and
renamed. ``--resume_from PATH`` continues from one. ``--epoch_local`` prints the iteration inside
the epoch instead, as many loops do (``epoch 1 | iter 50 | ...`` at step 150; ``iter`` restarts at
1 every ``--steps_per_epoch`` steps). Faults from FAULT / FAULT_MARKER (_faults.py).
Nothing here knows about any supervisor.

    python loop_logging_train.py --out_dir out [--steps 300 --save_every 20 --log_every 10] [--resume_from P]
"""
from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _faults import Fault

log = logging.getLogger("trainer")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out_dir", required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--steps_per_epoch", type=int, default=100)
    ap.add_argument("--save_every", type=int, default=20)
    ap.add_argument("--log_every", type=int, default=10)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--step_time", type=float, default=0.02, help="seconds of (simulated) data loading per step")
    ap.add_argument("--resume_from", default="")
    ap.add_argument("--epoch_local", action="store_true", help="print the iteration of the epoch, no total")
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.makedirs(a.out_dir, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    fault = Fault(a.out_dir)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=a.lr)
    done = 0
    if a.resume_from:
        ck = torch.load(a.resume_from, map_location="cpu", weights_only=True)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        done = int(ck["step"])
        log.info("resumed from %s at step %d", a.resume_from, done)
    gen = torch.Generator().manual_seed(1000 + done)
    w_true = torch.randn(16, 1, generator=torch.Generator().manual_seed(7))
    while done < a.steps:
        x = torch.randn(32, 16, generator=gen)
        y = x @ w_true
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        done += 1
        time.sleep(a.step_time)
        if done % a.log_every == 0 and a.epoch_local:
            log.info("epoch %d | iter %d | train_loss=%.4f | lr=%g", (done - 1) // a.steps_per_epoch,
                     (done - 1) % a.steps_per_epoch + 1, loss.item(), opt.param_groups[0]["lr"])
        elif done % a.log_every == 0:
            log.info("epoch %d | iter %d/%d | train_loss=%.4f | lr=%g", (done - 1) // a.steps_per_epoch, done,
                     a.steps, loss.item(), opt.param_groups[0]["lr"])
        fault.inject(done, list(model.parameters()))
        if done % a.save_every == 0:
            path = os.path.join(a.out_dir, f"step_{done}.pt")
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": done}, path + ".tmp")
            os.replace(path + ".tmp", path)
            log.info("saved checkpoint %s", path)
    if not all(math.isfinite(p.sum().item()) for p in model.parameters()):
        raise SystemExit("the final model is not finite")
    log.info("training finished at step %d", done)


if __name__ == "__main__":
    main()
