"""A tiny language model trained with PyTorch Lightning on random tokens, on the CPU.

What a user would write: a LightningModule, a ModelCheckpoint callback writing
``epoch=E-step=S.ckpt`` every few steps plus ``last.ckpt``, and ``trainer.fit(ckpt_path=...)``
with ``--ckpt_path PATH`` to resume. Faults come from FAULT / FAULT_MARKER (see _faults.py).

    python lightning_train.py --ckpt_dir ckpt --max_steps 40 --every_n_steps 5 [--ckpt_path ckpt/last.ckpt]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn as nn
import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback, ModelCheckpoint
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _faults import Fault

VOCAB, SEQ = 64, 32


class TinyLM(pl.LightningModule):
    def __init__(self, lr: float = 1e-3) -> None:
        super().__init__()
        self.lr = lr
        self.emb = nn.Embedding(VOCAB, 32)
        self.rnn = nn.GRU(32, 32, batch_first=True)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.emb(x))[0])

    def training_step(self, batch, batch_idx):
        (seq,) = batch
        logits = self(seq[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), seq[:, 1:].reshape(-1))
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


class FaultCallback(Callback):
    def __init__(self, fault: Fault) -> None:
        self.fault = fault

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.fault.inject(trainer.global_step, list(pl_module.parameters()))


class PrintLoss(Callback):
    """Prints the loss as one JSON line every few steps (for a log shipper; the bar shows it too)."""

    def __init__(self, every: int) -> None:
        self.every = every

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step % self.every == 0:
            print(json.dumps({"step": trainer.global_step, "loss": round(float(outputs["loss"]), 4)}))


def data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, VOCAB, (n, 1), generator=g)
    return TensorDataset((start + torch.arange(SEQ + 1)) % VOCAB)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt_dir", default="checkpoints")
    ap.add_argument("--max_steps", type=int, default=40)
    ap.add_argument("--every_n_steps", type=int, default=5)
    ap.add_argument("--log_every", type=int, default=1)
    ap.add_argument("--ckpt_path", default=None, help="resume from this checkpoint")
    args = ap.parse_args()
    pl.seed_everything(1234)
    torch.set_num_threads(1)
    model = TinyLM()
    ckpt = ModelCheckpoint(dirpath=args.ckpt_dir, every_n_train_steps=args.every_n_steps, save_top_k=-1,
                           save_last=True)
    trainer = pl.Trainer(max_steps=args.max_steps, accelerator="cpu", devices=1, logger=False,
                         callbacks=[ckpt, FaultCallback(Fault(args.ckpt_dir)), PrintLoss(args.log_every)],
                         enable_model_summary=False, log_every_n_steps=1)
    trainer.fit(model, DataLoader(data(512, 0), batch_size=8, shuffle=True), ckpt_path=args.ckpt_path)


if __name__ == "__main__":
    main()
