"""One ``*.safetensors`` file (``model_300.safetensors``); shards of a split export are not
checkpoints (``model-00001-of-00002.safetensors``)."""
from __future__ import annotations

from pathlib import Path

from .names import checkpoint_file, step_in_name
from .spec import Found, Layout, LayoutSpec, LoadKind


def recognise(path: Path) -> Found | None:
    if checkpoint_file(path) and path.name.endswith(".safetensors"):
        return Found(step_in_name(path.name))
    return None


SPEC = LayoutSpec(layout=Layout.SAFETENSORS, folder=False, load=LoadKind.SAFETENSORS, recognise=recognise,
                  doc="a *.safetensors file")
