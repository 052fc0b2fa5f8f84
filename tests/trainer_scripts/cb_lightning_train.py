"""A tiny Lightning model trained on random data with the supervisor's callback (CPU, offline).

The script a user would have, plus the one line (``callbacks=[SupervisorCallback()]``)::

    python cb_lightning_train.py ROOT_DIR --max-steps 8 [--log-every 2] [--val-every 4]
        [--ckpt-every N] [--self-signal STEP:SIGNAME] [--signal-in-val] [--devices 2 --self-signal-rank R]
        [--no-callback]

``--self-signal`` sends the signal to this process during training step STEP (with ``--devices 2``,
DDP on the CPU, only to rank R with ``--self-signal-rank``); ``--signal-in-val`` sends SIGTERM
during the first validation after training started (deterministic stand-ins for the supervisor's
requests). At the end (also when Lightning ends ``fit`` with SIGTERMException) it
prints ``RESULT {json}``: the final global step and what the stop signal's handler is.
"""
from __future__ import annotations

import argparse
import json
import os
import signal

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=False)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class SignalAt(pl.Callback):
    def __init__(self, step: int | None, sig: int, in_val: bool, rank: int | None) -> None:
        self.step, self.sig, self.in_val, self.rank = step, sig, in_val, rank

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.rank is not None and trainer.global_rank != self.rank:
            return
        if self.step is not None and trainer.global_step == self.step - 1:
            os.kill(os.getpid(), self.sig)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if self.in_val and not trainer.sanity_checking and batch_idx == 0:
            self.in_val = False
            os.kill(os.getpid(), signal.SIGTERM)


def loader(n: int, seed: int) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("root_dir")
    p.add_argument("--max-steps", type=int, default=8)
    p.add_argument("--log-every", type=int, default=2)
    p.add_argument("--val-every", type=int, default=0, help="validate every N training batches")
    p.add_argument("--ckpt-every", type=int, default=0, help="ModelCheckpoint every N steps (0: no ModelCheckpoint)")
    p.add_argument("--self-signal", action="append", default=[], help="STEP:SIGNAME")
    p.add_argument("--self-signal-rank", type=int, default=None)
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--signal-in-val", action="store_true")
    p.add_argument("--no-callback", action="store_true")
    a = p.parse_args()

    pl.seed_everything(0, verbose=False)
    callbacks: list[pl.Callback] = []
    for spec in a.self_signal:
        step, name = spec.split(":")
        callbacks.append(SignalAt(int(step), int(getattr(signal, name)), False, a.self_signal_rank))
    if a.signal_in_val:
        callbacks.append(SignalAt(None, signal.SIGTERM, True, None))
    if a.ckpt_every:
        callbacks.append(pl.callbacks.ModelCheckpoint(dirpath=os.path.join(a.root_dir, "ckpt"),
                                                      every_n_train_steps=a.ckpt_every, save_top_k=-1))
    if not a.no_callback:
        from supervisor.client.lightning import SupervisorCallback

        callbacks.append(SupervisorCallback())
    trainer = pl.Trainer(default_root_dir=a.root_dir, max_steps=a.max_steps, accelerator="cpu", devices=a.devices,
                         strategy="ddp" if a.devices > 1 else "auto",
                         logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=bool(a.ckpt_every), log_every_n_steps=a.log_every,
                         val_check_interval=a.val_every or None, check_val_every_n_epoch=None if a.val_every else 1,
                         limit_val_batches=4 if a.val_every else 0, num_sanity_val_steps=0, callbacks=callbacks)
    stop_sig = getattr(signal, os.environ.get("TSUP_STOP_SIGNAL") or "SIGTERM")
    try:
        trainer.fit(Tiny(), loader(4000, 1), loader(16, 2) if a.val_every else None)
    finally:
        print("RESULT " + json.dumps({"global_step": trainer.global_step, "rank": trainer.global_rank,
                                      "stop_handler": repr(signal.getsignal(stop_sig))}), flush=True)


if __name__ == "__main__":
    main()
