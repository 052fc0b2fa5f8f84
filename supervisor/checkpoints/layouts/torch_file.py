"""One torch file per step: ``step_1000.pt``, ``ckpt_00001000.pt``, ``model_500.bin``,
``step_1000_v2.pt``, ``model-step500-rank0.pt``; the step is the number after a step-like word, else
the name's one number (:func:`.names.name_step`). A name of several numbers, none after such a
word (``model_3_900.pt``), is one file per step whose step the name does not say: its manifest or
its content says it (``Found.step`` None)."""
from __future__ import annotations

from pathlib import Path

from .names import checkpoint_file, name_step
from .spec import Found, Layout, LayoutSpec, LoadKind


def recognise(path: Path) -> Found | None:
    if not checkpoint_file(path) or path.name.endswith(".safetensors"):
        return None
    said = name_step(path.name)
    return Found(said.step) if said.step is not None or said.doubt else None


SPEC = LayoutSpec(layout=Layout.FILE, folder=False, load=LoadKind.TORCH, recognise=recognise,
                  doc="one torch file per step: step_1000.pt, ckpt_00001000.pt, ...")
