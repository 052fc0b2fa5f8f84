"""PyTorch Lightning ``epoch=0-step=500.ckpt`` and ``last.ckpt`` (``last-v1.ckpt``); the step of
``last.ckpt`` comes from its manifest or the load test (``global_step`` inside)."""
from __future__ import annotations

import re
from pathlib import Path

from .names import checkpoint_file
from .spec import Found, Layout, LayoutSpec, LoadKind

_STEP = re.compile(r"(?:^|[-_])step=(\d+)")


def recognise(path: Path) -> Found | None:
    name = path.name
    if not (checkpoint_file(path) and name.endswith(".ckpt")):
        return None
    m = _STEP.search(name)
    if m is None and name != "last.ckpt" and not name.startswith("last-v"):
        return None
    return Found(int(m.group(1)) if m else None)


SPEC = LayoutSpec(layout=Layout.LIGHTNING, folder=False, load=LoadKind.TORCH, recognise=recognise,
                  doc="Lightning epoch=0-step=500.ckpt and last.ckpt")
