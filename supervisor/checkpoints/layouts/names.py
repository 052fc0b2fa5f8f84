"""Names shared by the layouts: temp names, checkpoint file suffixes, the step in a name (:func:`name_step`)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin", ".safetensors", ".tar")
_TEMP_SUFFIXES = (".tmp", ".temp", ".partial", ".part", ".incomplete", ".lock", ".swp")
# The number after a step-like word is the step: step_1000_v2.pt, model-step500-rank0.pt,
# global_step500, iter_0000500, ckpt_00001000.pt, checkpoint-500, Lightning's epoch=2-step=500.
_STEP_WORD = re.compile(r"(?<![A-Za-z])(?:global_step|step|iter(?:ation)?|checkpoint|ckpt)[-_=]?(\d+)", re.I)
# Numbers that are never a step: a rank, a version suffix (last-v1, _v2), a parallel degree or
# index, a shard's "00001-of-00002", a seed.
_NOT_STEP = re.compile(r"(?<![A-Za-z])(?:v|rank|mp_rank|dp_rank|tp|pp|ep|world_size|ws|seed|shard|part)[-_=]?\d+"
                       r"|\d+-of-\d+", re.I)
_NUMBER = re.compile(r"\d+")
_SHARD = re.compile(r"-\d+-of-\d+\.")  # model-00001-of-00002.safetensors: a shard, not a step


def is_temp_name(name: str) -> bool:
    low = name.lower()
    return (name.startswith(".") or low.startswith(("tmp-", "tmp_", "tmp.")) or low.endswith(_TEMP_SUFFIXES)
            or ".tmp" in low or ".partial" in low)


@dataclass(frozen=True)
class NameStep:
    """What a checkpoint's name says of its step: ``step`` when it says it plainly (None for a name
    without one, ``ckpt.pt``), ``doubt`` when its numbers may be anything (``model_3_900.pt``): the
    name is then not trusted for ordering, and the step comes from the manifest or the file."""

    step: int | None
    doubt: str | None = None


def name_step(name: str) -> NameStep:
    """The step in a checkpoint's name: the number after a step-like word, else the one number
    the name holds once ranks, versions and shard counts are left out. Never the last number of
    several: ``step_1000_v2.pt`` is step 1000, not 2 (a healthy run once resumed 100 steps back)."""
    suffix = next((s for s in CHECKPOINT_SUFFIXES if name.lower().endswith(s)), "")
    stem = name[:len(name) - len(suffix)]
    m = _STEP_WORD.search(stem)
    if m is not None:
        return NameStep(int(m.group(1)))
    numbers = _NUMBER.findall(_NOT_STEP.sub(" ", stem))
    if len(numbers) > 1:
        return NameStep(None, f"the name holds several numbers ({', '.join(numbers[:4])}) and none after a step "
                              "word (step, iter, ckpt, checkpoint, global_step): its step is taken from its manifest "
                              "or its content, else it is ordered by mtime")
    return NameStep(int(numbers[0]) if numbers else None)


def step_in_name(name: str) -> int | None:
    return name_step(name).step


def checkpoint_file(path: Path) -> bool:
    """A file with a checkpoint suffix that is not one shard of a split export."""
    return path.name.lower().endswith(CHECKPOINT_SUFFIXES) and not _SHARD.search(path.name)
