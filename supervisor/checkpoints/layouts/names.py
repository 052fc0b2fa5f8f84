"""Names shared by the layouts: temp names, checkpoint file suffixes, the step in a name."""
from __future__ import annotations

import re
from pathlib import Path

CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin", ".safetensors", ".tar")
_TEMP_SUFFIXES = (".tmp", ".temp", ".partial", ".part", ".incomplete", ".lock", ".swp")
STEP_IN_NAME = re.compile(r"(\d+)(?=\.[A-Za-z]+$|$)")  # the last number before the extension
_SHARD = re.compile(r"-\d+-of-\d+\.")  # model-00001-of-00002.safetensors: a shard, not a step


def is_temp_name(name: str) -> bool:
    low = name.lower()
    return (name.startswith(".") or low.startswith(("tmp-", "tmp_", "tmp.")) or low.endswith(_TEMP_SUFFIXES)
            or ".tmp" in low or ".partial" in low)


def step_in_name(name: str) -> int | None:
    m = STEP_IN_NAME.search(name)
    return int(m.group(1)) if m else None


def checkpoint_file(path: Path) -> bool:
    """A file with a checkpoint suffix that is not one shard of a split export."""
    return path.name.lower().endswith(CHECKPOINT_SUFFIXES) and not _SHARD.search(path.name)
