"""DeepSpeed ``global_step1000/`` (model and ZeRO optimizer state files inside)."""
from __future__ import annotations

import re
from pathlib import Path

from .spec import Found, Layout, LayoutSpec, LoadKind

_DIR = re.compile(r"^global_step(\d+)$")


def recognise(path: Path) -> Found | None:
    m = _DIR.match(path.name)
    return Found(int(m.group(1))) if m else None


SPEC = LayoutSpec(layout=Layout.DEEPSPEED, folder=True, load=LoadKind.FOLDER, recognise=recognise,
                  doc="DeepSpeed global_step1000/")
