"""One torch file per step: ``step_1000.pt``, ``ckpt_00001000.pt``, ``model_500.bin``; the step is
the last number before the extension."""
from __future__ import annotations

from pathlib import Path

from .names import checkpoint_file, step_in_name
from .spec import Found, Layout, LayoutSpec, LoadKind


def recognise(path: Path) -> Found | None:
    if not checkpoint_file(path) or path.name.endswith(".safetensors"):
        return None
    step = step_in_name(path.name)
    return Found(step) if step is not None else None


SPEC = LayoutSpec(layout=Layout.FILE, folder=False, load=LoadKind.TORCH, recognise=recognise,
                  doc="one torch file per step: step_1000.pt, ckpt_00001000.pt, ...")
