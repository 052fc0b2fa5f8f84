"""Regenerate the metric-file corpus: files written by the real writers, kept as they wrote them.

Usage (from the repository root; about a minute on 2 CPU cores)::

    .venv/bin/python tests/corpus/metricfiles/capture.py

Each run is a child process (``--child NAME``) on the CPU in a temporary directory; what the
writer left is copied here under a fixed name:

- ``torch_writer.tfevents``: ``torch.utils.tensorboard.SummaryWriter`` with the tutorial's tags
  (``Loss/train``, ``Loss/val``), ``loss``, a ``new_style=True`` tensor scalar, ``lr``; the loss
  is NaN from ``nan_step`` on.
- ``lightning_tb.tfevents`` and ``lightning_tb.hparams.yaml``: Lightning's default logger
  (TensorBoardLogger) for a tiny module logging ``train_loss`` every step and ``val_loss`` per
  epoch; the parameters become NaN after ``nan_after`` steps.
- ``lightning_csv.metrics.csv``: the same module with ``CSVLogger`` (rewritten with a wider
  header when ``val_loss`` first appears).
- ``hf_tb.tfevents``: the HF Trainer with ``report_to="tensorboard"`` (tiny GPT-2, random tokens).

``manifest.json`` records the parameters and library versions; the tests derive their
expectations from it.
"""
from __future__ import annotations

import glob
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TORCH = {"steps": 12, "nan_step": 8}
PL = {"train_batches": 6, "max_epochs": 2, "nan_after": 9, "log_every_n_steps": 1}
HF = {"max_steps": 8, "logging_steps": 2}


def child_torch(out: str) -> None:
    import torch
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(log_dir=out)
    for step in range(TORCH["steps"]):
        loss = math.nan if step >= TORCH["nan_step"] else 2.0 - step * 0.1
        w.add_scalar("Loss/train", loss, step)
        w.add_scalar("loss", loss, step)
        w.add_scalar("lr", 0.01, step)
        if step % 4 == 3:
            w.add_scalar("Loss/val", loss + 0.5, step)
            w.add_scalar("tensor/loss", torch.tensor(loss), step, new_style=True)
    w.close()


def _pl_module():
    import lightning as L
    import torch
    from torch import nn

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(4, 1)

        def training_step(self, batch, i):
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, i):
            x, y = batch
            self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

        def on_train_batch_end(self, outputs, batch, i):
            if self.global_step == PL["nan_after"]:
                with torch.no_grad():
                    for p in self.parameters():
                        p.fill_(math.nan)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return Tiny()


def _pl_fit(out: str, logger: object) -> None:
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    ds = TensorDataset(torch.randn(PL["train_batches"] * 2, 4), torch.randn(PL["train_batches"] * 2, 1))
    trainer = L.Trainer(default_root_dir=out, max_epochs=PL["max_epochs"], accelerator="cpu", devices=1,
                        log_every_n_steps=PL["log_every_n_steps"], enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, logger=logger)  # type: ignore[arg-type]
    trainer.fit(_pl_module(), DataLoader(ds, batch_size=2), DataLoader(ds, batch_size=4))


def child_lightning_tb(out: str) -> None:
    _pl_fit(out, True)  # True: the default logger, TensorBoardLogger when tensorboard is installed


def child_lightning_csv(out: str) -> None:
    from lightning.pytorch.loggers import CSVLogger

    _pl_fit(out, CSVLogger(out))


def child_hf(out: str) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)

    class Tokens(torch.utils.data.Dataset):
        def __init__(self) -> None:
            self.x = torch.randint(0, 64, (64, 16))

        def __len__(self) -> int:
            return len(self.x)

        def __getitem__(self, i):
            return {"input_ids": self.x[i], "labels": self.x[i]}

    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                               bos_token_id=0, eos_token_id=0))
    args = TrainingArguments(output_dir=out, max_steps=HF["max_steps"], logging_steps=HF["logging_steps"],
                             report_to="tensorboard", use_cpu=True,
                             save_strategy="no", per_device_train_batch_size=4, disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=Tokens()).train()


CHILDREN = {"torch_writer": child_torch, "lightning_tb": child_lightning_tb, "lightning_csv": child_lightning_csv,
            "hf_tb": child_hf}


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        CHILDREN[sys.argv[2]](sys.argv[3])
        return
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"}
    for name in CHILDREN:
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, __file__, "--child", name, tmp], env=env, check=True,
                           stdout=subprocess.DEVNULL)
            if name == "lightning_csv":
                [csv] = glob.glob(f"{tmp}/**/metrics.csv", recursive=True)
                shutil.copy(csv, HERE / f"{name}.metrics.csv")
            else:
                [ev] = glob.glob(f"{tmp}/**/events.out.tfevents.*", recursive=True)
                shutil.copy(ev, HERE / f"{name}.tfevents")
    import lightning
    import tensorboard
    import torch
    import transformers

    manifest = {"torch_writer": TORCH, "lightning": PL, "hf": HF,
                "versions": {"torch": torch.__version__, "lightning": lightning.__version__,
                             "tensorboard": tensorboard.__version__, "transformers": transformers.__version__}}
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
