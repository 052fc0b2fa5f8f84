"""A nanoGPT-style training script: a tiny GPT on random tokens, on the CPU.

Written the way nanoGPT's train.py is: module-level config overridden by ``--key=value``
arguments (its configurator), ``iter N: loss X, time Yms, mfu Z%`` every ``log_interval``
iterations, ``step N: train loss X, val loss Y`` at each evaluation, and one checkpoint,
``out_dir/ckpt.pt``, overwritten at each evaluation with the model, the optimizer and
``iter_num``. ``--init_from=resume`` resumes from it. Faults come from FAULT / FAULT_MARKER
(see _faults.py; inert when FAULT is unset: bench/bench_recovery.py runs it so, as an
unmodified nanoGPT-style script).

    python nanogpt_train.py --out_dir=out --max_iters=200 --eval_interval=20 [--init_from=resume]
"""
from __future__ import annotations

import math
import os
import sys
import time
from ast import literal_eval

import torch
import torch.nn as nn
from torch.nn import functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _faults import Fault

# ----------------------------------------------------------------------------- config
out_dir = "out"
eval_interval = 20
log_interval = 1
eval_iters = 4
always_save_checkpoint = True
init_from = "scratch"  # 'scratch' or 'resume'
batch_size = 8
block_size = 32
vocab_size = 64
n_layer = 2
n_head = 2
n_embd = 32
dropout = 0.0
learning_rate = 1e-3
max_iters = 200
weight_decay = 0.1
beta1, beta2 = 0.9, 0.95
grad_clip = 1.0
seed = 1337
iter_sleep = 0.0  # seconds of pause per iteration: tests set the save cadence with it (a real job's compute)
check_finite = True  # exit 1 when the final model is not finite (the bench turns it off: nanoGPT has no such check)
# nanoGPT's configurator: --key=value overrides a global of the same name.
config_keys = [k for k, v in globals().items() if not k.startswith("_") and isinstance(v, (int, float, bool, str))]
for arg in sys.argv[1:]:
    if not arg.startswith("--") or "=" not in arg:
        raise SystemExit(f"unknown argument {arg!r} (expected --key=value)")
    key, val = arg[2:].split("=", 1)
    if key not in globals():
        raise SystemExit(f"Unknown config key: {key}")
    try:
        attempt = literal_eval(val)
    except (SyntaxError, ValueError):
        attempt = val
    assert type(attempt) == type(globals()[key]), f"{key}: {attempt!r} is not a {type(globals()[key]).__name__}"  # noqa: E721 - nanoGPT's configurator, as a user has it
    print(f"Overriding: {key} = {attempt}")
    globals()[key] = attempt
config = {k: globals()[k] for k in config_keys}
# ----------------------------------------------------------------------------- model


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = nn.MultiheadAttention(n_embd, n_head, dropout=dropout, batch_first=True)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(Block() for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        t = idx.size(1)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        x = self.wte(idx) + self.wpe(torch.arange(t))
        for b in self.blocks:
            x = b(x, mask)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def get_batch(split: str, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random sequences where each token is usually the previous one + 1 (learnable)."""
    start = torch.randint(0, vocab_size, (batch_size, 1), generator=gen)
    noise = (torch.rand(batch_size, block_size + 1, generator=gen) < 0.2).long() * \
        torch.randint(0, vocab_size, (batch_size, block_size + 1), generator=gen)
    seq = (start + torch.arange(block_size + 1) + noise) % vocab_size
    return seq[:, :-1], seq[:, 1:]


@torch.no_grad()
def estimate_loss(model: GPT) -> dict[str, float]:
    out = {}
    model.eval()
    for split in ("train", "val"):
        gen = torch.Generator().manual_seed(0 if split == "train" else 1)
        out[split] = sum(model(*get_batch(split, gen)).item() for _ in range(eval_iters)) / eval_iters
    model.train()
    return out


def main() -> None:
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    fault = Fault(out_dir)
    model = GPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, betas=(beta1, beta2),
                                  weight_decay=weight_decay)
    iter_num, best_val_loss = 0, 1e9
    if init_from == "resume":
        print(f"Resuming training from {out_dir}")
        checkpoint = torch.load(os.path.join(out_dir, "ckpt.pt"), map_location="cpu")
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        iter_num, best_val_loss = checkpoint["iter_num"], checkpoint["best_val_loss"]
    gen = torch.Generator().manual_seed(seed + iter_num)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"number of parameters: {n_params / 1e6:.2f}M")
    t0 = time.time()
    running_mfu = -1.0
    while True:
        if iter_num % eval_interval == 0:
            losses = estimate_loss(model)
            print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
            if losses["val"] < best_val_loss or always_save_checkpoint:
                best_val_loss = min(best_val_loss, losses["val"])
                if iter_num > 0:
                    checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                  "model_args": {"n_layer": n_layer, "n_head": n_head, "n_embd": n_embd,
                                                 "block_size": block_size, "vocab_size": vocab_size},
                                  "iter_num": iter_num, "best_val_loss": best_val_loss, "config": config}
                    print(f"saving checkpoint to {out_dir}")
                    torch.save(checkpoint, os.path.join(out_dir, "ckpt.pt"))
        if iter_num >= max_iters:
            break
        x, y = get_batch("train", gen)
        loss = model(x, y)
        loss.backward()
        if grad_clip != 0.0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        t1 = time.time()
        dt, t0 = t1 - t0, t1
        if iter_num % log_interval == 0:
            lossf = loss.item()
            mfu = 6 * n_params * batch_size * block_size / max(dt, 1e-9) / 1e12 / 10  # vs a 10 TFLOPS CPU
            running_mfu = mfu if running_mfu == -1.0 else 0.9 * running_mfu + 0.1 * mfu
            print(f"iter {iter_num}: loss {lossf:.4f}, time {dt * 1000:.2f}ms, mfu {running_mfu * 100:.2f}%")
        fault.inject(iter_num, list(model.parameters()))
        if iter_sleep:
            time.sleep(iter_sleep)
        iter_num += 1
    if check_finite and not all(math.isfinite(p.sum().item()) for p in model.parameters()):
        raise SystemExit("the final model is not finite")


if __name__ == "__main__":
    main()
