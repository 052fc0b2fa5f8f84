"""Checkpoints still being written, for people: what ``checkpoints`` lists besides the quicklist.

Discovery skips them on purpose (a half-written file is never a resume candidate), so a
checkpoint dir whose only checkpoint is being saved would otherwise read "no checkpoints found".
Three signs, each with its reason:

- a temp name that looks like a checkpoint (``.step_000100.pt.123.tmp``, ``ckpt.pt.partial``,
  ``tmp-step-5/``): the writer renames it when done;
- a checkpoint its layout says is not complete yet (``layouts/``): ``checkpoint-N/`` without
  ``trainer_state.json`` (HF Trainer), ``step-N/`` without ``.metadata`` (torch.distributed.checkpoint),
  a Megatron ``iter_N/`` its tracker file does not name yet;
- an entry discovery saw change within its settle window (``Discovery.unsettled``).

A save that died leaves the same signs; the age of the last write tells the two apart.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from .discovery import CHECKPOINT_SUFFIXES, LAST_GOOD_DIR, QUARANTINE_DIR, is_temp_name, recognise
from .layouts import registry
from .layouts.names import name_step
from .listing import newest_entries
from .manifest import MANIFEST_SUFFIX, stat_record
from ..humanize import size
from ..textescape import escaped

# A temp name that looks like a checkpoint's: a checkpoint suffix or a step folder's name.
_STEP_DIR = re.compile(r"^(?:step|ckpt|checkpoint|iter|epoch|global_step)[-_]?(\d+)$")


@dataclass(frozen=True)
class InProgress:
    path: Path
    step: int | None
    reason: str
    size: int
    mtime: float

    def to_json(self) -> dict[str, Any]:
        """A ``checkpoints --json`` row: the quicklist's keys, not ready, ``writing`` true."""
        return {"path": str(self.path), "step": self.step, "layout": "writing", "exists": True, "complete": False,
                "sha256_ok": None, "config_matches": None, "config_diff": {}, "val_metric": None,
                "load_test": None, "ready": False, "writing": True, "size": self.size, "mtime": self.mtime,
                "reasons": [f"still being written: {self.reason}"]}


def _looks_like_checkpoint(name: str) -> bool:
    low = name.lower().lstrip(".")
    return any(s in low for s in CHECKPOINT_SUFFIXES) or bool(_STEP_DIR.search(low.split(".")[0]))


def _step(name: str) -> int | None:
    return name_step(name.lstrip(".")).step  # the one reading of a name's step (layouts/names.py)


def _why_writing(p: Path) -> str | None:
    """What its layout says is missing yet, or why it looks like a layout being written."""
    entry = recognise(p)
    if entry is not None:
        return entry.missing
    return registry.pending_reason(p)


def in_progress(checkpoint_dir: Path, unsettled: Iterable[Path] = ()) -> list[InProgress]:
    """Entries of ``checkpoint_dir`` that are checkpoints being written, newest first."""
    found: dict[Path, str] = {}
    try:  # the newest entries only, as discovery's (listing.py): a save in progress is among them
        children = newest_entries(Path(checkpoint_dir), lambda n: n in (QUARANTINE_DIR, LAST_GOOD_DIR)
                                  or n.endswith(MANIFEST_SUFFIX)).paths
    except OSError:
        return []
    for p in children:
        name = p.name
        if is_temp_name(name):
            if _looks_like_checkpoint(name):
                found[p] = "a temporary name (the writer renames it when the save is complete)"
        elif why := _why_writing(p):
            found[p] = why
    for p in unsettled:
        found.setdefault(Path(p), "it changed within the last seconds")
    out: list[InProgress] = []
    for p, why in found.items():
        try:
            st = stat_record(p)
        except OSError:
            continue  # renamed by its writer while we looked: done
        out.append(InProgress(p, _step(p.name), why, int(st["size"]), st["mtime_ns"] / 1e9))
    return sorted(out, key=lambda c: c.mtime, reverse=True)


def render(rows: list[InProgress], now: float | None = None) -> str:
    """One line per checkpoint being written: size, the age of its last write, why."""
    now = time.time() if now is None else now
    lines = []
    for r in rows:
        age = max(0.0, now - r.mtime)
        lines.append(f"writing  {escaped(r.path)}  ({size(r.size)} so far, last write {_ago(age)} ago): "
                     f"{escaped(r.reason)}"
                     + ("; no write for a while: the save may have died" if age > 600 else ""))
    return "\n".join(lines)


def _ago(s: float) -> str:
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{s // 60:.0f} min"
    return f"{s / 3600:.1f} h"
