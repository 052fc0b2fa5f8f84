"""A Lightning 2.x script at its DEFAULTS: no progress-bar, logger or checkpoint-callback
arguments beyond what a user writes. With ``rich`` installed Lightning draws the Rich bar (nothing
per step into a pipe) and logs through the TensorBoard logger into ``lightning_logs/version_N/``
under the working directory: the supervisor sees the run only through those files.

A stock ``ModelCheckpoint(every_n_train_steps=...)``; ``--ckpt_path`` resumes. ``--pkg`` picks
``import lightning as L`` or ``import pytorch_lightning as pl``; ``--logger csv`` swaps in the
CSVLogger (the only other change); ``--log_every_n_steps`` is the one Trainer knob a user with a
short run sets (unset: Lightning's default, every 50 steps). ``--step_s`` stands for a real step's compute.
Faults from FAULT / FAULT_MARKER (_faults.py).

    python lightning_default.py --ckpt_dir ckpt --max_steps 60 [--pkg pytorch_lightning] [--logger csv]
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from typing import Any

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _faults import Fault

VOCAB, SEQ = 32, 16


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pkg", default="lightning", choices=["lightning", "pytorch_lightning"])
    ap.add_argument("--logger", default="default", choices=["default", "csv"])
    ap.add_argument("--ckpt_dir", default="checkpoints")
    ap.add_argument("--max_steps", type=int, default=60)
    ap.add_argument("--every_n_steps", type=int, default=5)
    ap.add_argument("--log_every_n_steps", type=int, default=None, help="default: Lightning's (50)")
    ap.add_argument("--step_s", type=float, default=0.1)
    ap.add_argument("--ckpt_path", default=None)
    args = ap.parse_args()
    if args.pkg == "lightning":
        L: Any = importlib.import_module("lightning")
        from lightning.pytorch.callbacks import Callback, ModelCheckpoint
        from lightning.pytorch.loggers import CSVLogger
    else:
        L = importlib.import_module("pytorch_lightning")
        from pytorch_lightning.callbacks import Callback, ModelCheckpoint
        from pytorch_lightning.loggers import CSVLogger

    class TinyLM(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(VOCAB, 16)
            self.head = nn.Linear(16, VOCAB)

        def training_step(self, batch, batch_idx):
            (seq,) = batch
            loss = F.cross_entropy(self.head(self.emb(seq[:, :-1])).reshape(-1, VOCAB), seq[:, 1:].reshape(-1))
            self.log("train_loss", loss)
            time.sleep(args.step_s)
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    class FaultCallback(Callback):
        def __init__(self) -> None:
            self.fault = Fault(args.ckpt_dir)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.fault.inject(trainer.global_step, list(pl_module.parameters()))

    L.seed_everything(1234)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset((torch.randint(0, VOCAB, (256, 1), generator=g) + torch.arange(SEQ + 1)) % VOCAB)
    extra: dict = {"logger": CSVLogger(".")} if args.logger == "csv" else {}
    if args.log_every_n_steps is not None:
        extra["log_every_n_steps"] = args.log_every_n_steps
    trainer = L.Trainer(max_steps=args.max_steps, accelerator="cpu", devices=1,
                        callbacks=[ModelCheckpoint(dirpath=args.ckpt_dir, every_n_train_steps=args.every_n_steps,
                                                   save_top_k=-1), FaultCallback()], **extra)
    trainer.fit(TinyLM(), DataLoader(data, batch_size=8, shuffle=True), ckpt_path=args.ckpt_path)


if __name__ == "__main__":
    main()
