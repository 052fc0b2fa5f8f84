"""HF Trainer ``checkpoint-500/``: complete once ``trainer_state.json`` is there (the Trainer
writes it last, so a folder without it is still being saved, or its save died).

Not checkpoints although they look like one: ``training_args.bin`` (a pickle of the
TrainingArguments, anywhere), and beside checkpoint-N/ folders the final export
``Trainer.save_model`` writes at the top of its output dir (``model.safetensors``,
``pytorch_model.bin``, adapters): weights without optimizer or trainer state, which
``--resume_from_checkpoint`` cannot resume.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

from .spec import Found, Layout, LayoutSpec, LoadKind

STATE_FILE = "trainer_state.json"
_DIR = re.compile(r"^checkpoint-(\d+)$")
EXPORT_NAMES = frozenset({"model.safetensors", "pytorch_model.bin", "adapter_model.safetensors",
                          "adapter_model.bin"})


def recognise(path: Path) -> Found | None:
    m = _DIR.match(path.name)
    if m is None:
        return None
    missing = None if (path / STATE_FILE).is_file() else f"no {STATE_FILE} yet (the HF Trainer writes it last)"
    return Found(int(m.group(1)), missing)


def shadows(children: Sequence[Path]) -> frozenset[str]:
    """The Trainer's final export beside its checkpoint-N/ folders is not resumable."""
    return EXPORT_NAMES if any(_DIR.match(p.name) and p.is_dir() for p in children) else frozenset()


SPEC = LayoutSpec(layout=Layout.HF, folder=True, load=LoadKind.FOLDER, recognise=recognise, shadows=shadows,
                  never=frozenset({"training_args.bin"}),
                  doc="HF Trainer checkpoint-500/ (complete once trainer_state.json is written)")
