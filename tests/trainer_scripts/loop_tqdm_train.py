"""A plain PyTorch loop whose only metric output is a tqdm bar with a description and the loss in
its postfix, as many hand-written scripts do:

    for step in tqdm(range(start, steps), desc="train", initial=start, total=steps):
        ...
        bar.set_postfix(loss=f"{loss.item():.4f}")

On stderr, redrawn with ``\\r`` (tqdm's mininterval, 0.1 s): ``train:  19%|#9  | 58/300 [00:02<00:09,
25.1it/s, loss=nan]``. While iteration ``i`` runs the bar's counter is ``i`` (iterations done), so
the loss shown beside counter ``i`` is the loss of step index ``i``. A checkpoint ``ckpt_<N>.pt``
(N = optimizer steps done) every ``--save_every`` steps, temp name then rename, reported with
``tqdm.write``; ``--resume_from PATH`` continues from one. Faults from FAULT / FAULT_MARKER
(_faults.py; ``nan@N`` poisons the weights after step index N, so index N+1 shows the NaN).

    python loop_tqdm_train.py --out_dir out [--steps 300 --save_every 25] [--resume_from P]
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch
import torch.nn as nn
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _faults import Fault


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out_dir", required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--save_every", type=int, default=25)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--step_time", type=float, default=0.03, help="seconds of (simulated) data loading per step")
    ap.add_argument("--resume_from", default="")
    a = ap.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    fault = Fault(a.out_dir)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=a.lr)
    start = 0
    if a.resume_from:
        ck = torch.load(a.resume_from, map_location="cpu", weights_only=True)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        start = int(ck["step"])
        tqdm.write(f"resumed from {a.resume_from}")
    gen = torch.Generator().manual_seed(1000 + start)
    w_true = torch.randn(16, 1, generator=torch.Generator().manual_seed(7))
    bar = tqdm(range(start, a.steps), desc="train", initial=start, total=a.steps)
    for step in bar:
        x = torch.randn(32, 16, generator=gen)
        loss = nn.functional.mse_loss(model(x), x @ w_true)
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(a.step_time)
        bar.set_postfix(loss=f"{loss.item():.4f}")
        fault.inject(step, list(model.parameters()))
        done = step + 1
        if done % a.save_every == 0:
            path = os.path.join(a.out_dir, f"ckpt_{done}.pt")
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": done}, path + ".tmp")
            os.replace(path + ".tmp", path)
            tqdm.write(f"saved {path}")
    bar.close()
    if not all(math.isfinite(p.sum().item()) for p in model.parameters()):
        raise SystemExit("the final model is not finite")


if __name__ == "__main__":
    main()
