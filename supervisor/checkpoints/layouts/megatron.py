"""Megatron-LM ``iter_0001000/``: complete once ``latest_checkpointed_iteration.txt`` beside it
(Megatron updates it last) names this iteration or a later one. Without a tracker file every
iteration folder counts as complete."""
from __future__ import annotations

import re
from pathlib import Path

from ..manifest import read_capped
from .spec import Found, Layout, LayoutSpec, LoadKind

TRACKER = "latest_checkpointed_iteration.txt"
_DIR = re.compile(r"^iter_(\d+)$")


def latest(checkpoint_dir: Path) -> int | None:
    """The iteration Megatron's tracker file names."""
    try:
        # An iteration number or "release": a few bytes (a bigger file is not Megatron's tracker).
        raw = read_capped(checkpoint_dir / TRACKER, 64)
    except OSError:
        return None
    text = (raw or b"").decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None


def recognise(path: Path) -> Found | None:
    m = _DIR.match(path.name)
    if m is None:
        return None
    step = int(m.group(1))
    done = latest(path.parent)
    if done is not None and step > done:
        return Found(step, f"{TRACKER} names iteration {done} (Megatron updates it last)")
    return Found(step)


SPEC = LayoutSpec(layout=Layout.MEGATRON, folder=True, load=LoadKind.FOLDER, recognise=recognise,
                  doc="Megatron-LM iter_0001000/ (complete once latest_checkpointed_iteration.txt names it)")
