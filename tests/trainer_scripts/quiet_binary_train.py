"""A plain PyTorch loop that prints two lines and then trains in silence, keeping its loss only in
a private binary file (``<out_dir>/losses.dat``: one little-endian float64 per step, a format no
tool reads); ``--nan_at N`` makes the loss NaN from step N (its backward step then writes NaN into
every weight). At the end it saves ``<ckpt_dir>/step_<N>.pt`` (the model's state dict) and
exits 0, as a loop that never checks its loss does.

    python quiet_binary_train.py --out_dir out --ckpt_dir ckpt --steps 40 --step_s 0.1 --nan_at 20
"""
from __future__ import annotations

import argparse
import os
import struct
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out_dir", default="out")
    ap.add_argument("--ckpt_dir", default="ckpt")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--step_s", type=float, default=0.1)
    ap.add_argument("--nan_at", type=int, default=0, help="0: never")
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    os.makedirs(args.ckpt_dir, exist_ok=True)
    losses = open(os.path.join(args.out_dir, "losses.dat"), "ab")
    print("quiet trainer: starting", flush=True)
    import torch  # after the banner, as a script that sets up its logging first

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    print(f"{sum(p.numel() for p in model.parameters())} parameters", flush=True)
    with losses:
        for step in range(1, args.steps + 1):
            x = torch.randn(32, 8)
            loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
            if args.nan_at and step >= args.nan_at:
                loss = loss * float("nan")
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.write(struct.pack("<d", loss.item()))
            losses.flush()
            time.sleep(args.step_s)
    torch.save(model.state_dict(), os.path.join(args.ckpt_dir, f"step_{args.steps}.pt"))


if __name__ == "__main__":
    main()
