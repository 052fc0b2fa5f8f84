"""One torch file the job overwrites at every save, without a step in its name (nanoGPT
``ckpt.pt``). Its step comes from its manifest or the load test (``iter_num`` inside), and each
verified version is kept in ``last_good/`` so a bad overwrite cannot destroy the only good state."""
from __future__ import annotations

from pathlib import Path

from .names import NameStep, checkpoint_file, name_step
from .spec import Found, Layout, LayoutSpec, LoadKind


def recognise(path: Path) -> Found | None:
    if not checkpoint_file(path) or path.name.endswith(".safetensors") or name_step(path.name) != NameStep(None):
        return None
    return Found(None)


SPEC = LayoutSpec(layout=Layout.SINGLE, folder=False, load=LoadKind.TORCH, recognise=recognise,
                  keeps_last_good=True, doc="one overwritten file without a step in its name (nanoGPT ckpt.pt)")
