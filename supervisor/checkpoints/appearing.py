"""Find a checkpoint folder by what appears under the job's working directory during the run.

When neither the config nor the command names one, the checkpoint dir is the folder holding the
newest checkpoint-shaped entry (as the layout registry recognises it: HF ``checkpoint-N/``,
``step_100.pt``, ``last.ckpt``, a DCP folder, ...) written since the run began. The scan is
bounded (depth, entries) and skips what is never a job's checkpoint folder (virtual envs, .git,
site-packages, caches, the supervisor's own state dir), because it runs every few seconds on the
daemon's main loop: a few hundred stats, never a walk of a dataset tree.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from .discovery import LAST_GOOD_DIR, QUARANTINE_DIR, recognise
from .layouts.spec import Layout

MAX_DEPTH = 4  # workdir/out/run1/checkpoints/step_10.pt
MAX_ENTRIES = 3000  # per scan, all roots together
SKIP_NAMES = frozenset({".git", ".hg", ".svn", ".venv", "venv", "env", "site-packages", "dist-packages",
                        "node_modules", "__pycache__", ".tsup", ".cache", ".mypy_cache", ".pytest_cache",
                        ".tox", "wandb", "mlruns", QUARANTINE_DIR, LAST_GOOD_DIR})
# One overwritten file without a step (nanoGPT's ckpt.pt) is recognised by its suffix alone; in a
# scan of a whole working tree that would take any cache.pt for a checkpoint, so its name must
# also say so.
_SINGLE_WORDS = ("ckpt", "checkpoint", "last", "state")


@dataclass(frozen=True)
class Appeared:
    """The newest checkpoint-shaped entry found and the folder that holds it."""

    entry: Path
    folder: Path
    layout: Layout
    mtime: float


def _plausible(path: Path, layout: Layout) -> bool:
    if layout is Layout.SINGLE:
        low = path.name.lower()
        return any(w in low for w in _SINGLE_WORDS)
    return True


def scan(roots: Iterable[Path], *, since: float, skip: Iterable[Path] = ()) -> Appeared | None:
    """The newest checkpoint-shaped entry modified at or after ``since`` (wall seconds) under
    ``roots``, or None. Never raises: an unreadable folder is passed over."""
    skipped = {_real(p) for p in skip}
    budget = [MAX_ENTRIES]
    best: Appeared | None = None
    for root in roots:
        for found in _walk(root, 0, since, skipped, budget):
            if best is None or found.mtime > best.mtime:
                best = found
    return best


def _real(p: Path) -> str:
    try:
        return os.path.realpath(p)
    except OSError:
        return str(p)


def _walk(folder: Path, depth: int, since: float, skipped: set[str], budget: list[int]) -> Iterable[Appeared]:
    if depth > MAX_DEPTH or budget[0] <= 0 or _real(folder) in skipped:
        return
    try:
        with os.scandir(folder) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError:
        return
    if any(e.name == "pyvenv.cfg" for e in entries):  # a virtual env under any name
        return
    subdirs: list[Path] = []
    for e in entries:
        budget[0] -= 1
        if budget[0] < 0:
            return
        if e.name in SKIP_NAMES or e.name.endswith(".egg-info"):
            continue
        path = Path(e.path)
        try:
            is_dir = e.is_dir(follow_symlinks=False)
            mtime = e.stat(follow_symlinks=False).st_mtime
        except OSError:
            continue
        entry = recognise(path) if (is_dir or e.is_file(follow_symlinks=False)) else None
        if entry is not None:
            if mtime >= since and _plausible(path, entry.spec.layout):
                yield Appeared(path, folder, entry.spec.layout, mtime)
            continue  # a checkpoint folder's insides are not more checkpoints
        if is_dir and not e.name.startswith("."):
            subdirs.append(path)
    for d in subdirs:
        yield from _walk(d, depth + 1, since, skipped, budget)
