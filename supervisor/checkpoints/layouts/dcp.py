"""torch.distributed.checkpoint (torchtitan ``step-1000/``, Megatron-core torch_dist ``iter_N/``):
a folder with ``.metadata``, which DCP writes last, after every rank's shards."""
from __future__ import annotations

import re
from pathlib import Path

from .names import step_in_name
from .spec import Found, Layout, LayoutSpec, LoadKind

METADATA = ".metadata"
# Step folders DCP users name (torchtitan step-N); one without .metadata is a save in progress.
_STEP_DIR = re.compile(r"^(?:step|ckpt|checkpoint|iter|epoch)[-_]?(\d+)$")


def recognise(path: Path) -> Found | None:
    if (path / METADATA).is_file():
        return Found(step_in_name(path.name))
    return None


def pending(path: Path) -> str | None:
    if _STEP_DIR.match(path.name):
        return "no .metadata yet (torch.distributed.checkpoint writes it last)"
    return None


SPEC = LayoutSpec(layout=Layout.DCP, folder=True, load=LoadKind.DCP, recognise=recognise, pending=pending,
                  doc="torch.distributed.checkpoint / torchtitan step-1000/ with .metadata")
