"""Find checkpoints in a directory, skipping ones still being written.

The layouts (``Candidate.layout``) are the specs in ``layouts/registry.py``, one module each
(torch file per step, nanoGPT's overwritten ``ckpt.pt``, Lightning, safetensors, HF
``checkpoint-N/``, DCP, Megatron, DeepSpeed), plus two that say where a checkpoint came from:
``custom`` (matched by the configured glob, step from the configured regex) and ``last_good``
(a copy the supervisor kept aside in last_good/, see quarantine.preserve_last_good).

A checkpoint is still being written when its name is a temp name (.x, *.tmp, *.partial, tmp-*),
its layout says something its writer adds last is missing (an HF folder's trainer_state.json, a
Megatron iteration its tracker file does not name yet), or its size / newest mtime changed
within ``settle_s`` or since the previous scan. The clock is injected so tests need not wait.
"""
from __future__ import annotations

import itertools
import re
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

import structlog

from .layouts import registry
from .layouts.names import CHECKPOINT_SUFFIXES, is_temp_name
from .layouts.spec import Layout
from .listing import LISTING_CAP, Listing, newest_entries
from .manifest import MANIFEST_SUFFIX, stat_record

__all__ = ["CHECKPOINT_SUFFIXES", "Candidate", "Discovery", "LAST_GOOD_DIR", "Layout", "NOTE_SUFFIX",
           "QUARANTINE_DIR", "classify", "is_temp_name", "newest_complete", "sort_newest_first",
           "written_by_supervisor"]

QUARANTINE_DIR = "quarantine"
LAST_GOOD_DIR = "last_good"
NOTE_SUFFIX = ".quarantine.json"

log = structlog.get_logger("supervisor.checkpoints")
# Folders whose listing was past its bounds at their last scan, by any Discovery of this process:
# said once an episode, although status' interval advice makes a Discovery of its own each time.
_capped: set[Path] = set()
_capped_lock = threading.Lock()


@dataclass(frozen=True)
class Candidate:
    """A complete, settled checkpoint. ``step`` is None when its name does not say."""

    path: Path
    step: int | None
    layout: Layout
    mtime: float  # newest mtime in the file or folder (seconds since the epoch)
    size: int  # bytes, a folder's files summed

    def with_step(self, step: int | None) -> "Candidate":
        return replace(self, step=step)


def written_by_supervisor(name: str) -> bool:
    """An entry of a checkpoint dir that the supervisor itself writes, never the job: manifests,
    quarantine notes, the ``quarantine/`` and ``last_good/`` folders, and their temp files. A scan
    for signs of the job at work (files being written) must skip these: the background
    verification writes a manifest seconds after each checkpoint, whatever the job is doing."""
    return (name in (QUARANTINE_DIR, LAST_GOOD_DIR) or name.endswith((MANIFEST_SUFFIX, NOTE_SUFFIX))
            or (name.startswith(".") and (f"{MANIFEST_SUFFIX}." in name or name.endswith(".restore.tmp"))))


def _skipped(path: Path) -> bool:
    """A temp name or the supervisor's own sidecar: never looked at as a checkpoint."""
    return _skipped_name(path.name)


def _skipped_name(name: str) -> bool:
    return is_temp_name(name) or name.endswith((MANIFEST_SUFFIX, NOTE_SUFFIX))


def _not_listed(name: str) -> bool:
    """Names the bounded listing leaves out before they count among the newest."""
    return name in (QUARANTINE_DIR, LAST_GOOD_DIR) or _skipped_name(name)


def recognise(path: Path) -> registry.Entry | None:
    """The layout of one directory entry, complete or still being written, or None."""
    return None if _skipped(path) else registry.recognise(path)


def classify(path: Path) -> tuple[Layout, int | None] | None:
    """The layout and step of one complete directory entry, or None when it is not a checkpoint
    (or one still being written)."""
    entry = recognise(path)
    if entry is None or not entry.complete:
        return None
    return entry.spec.layout, entry.step


class Discovery:
    """Scans one checkpoint dir. Keeps the previous scan's sizes to notice files still growing.

    Thread-safe; ``clock`` returns wall-clock seconds (comparable with file mtimes).
    """

    def __init__(self, checkpoint_dir: Path, *, glob: str | None = None, step_regex: str | None = None,
                 settle_s: float = 2.0, clock: Callable[[], float] = time.time,
                 follow_symlinks_out: bool = False) -> None:
        self.dir = Path(checkpoint_dir)
        # A symlink in the checkpoint dir that leads outside it is skipped unless this is set:
        # the supervisor hashes, load-tests and hands the job only what lives in its own dir.
        self.follow_symlinks_out = follow_symlinks_out
        self.glob = glob
        self.step_regex = re.compile(step_regex) if step_regex else None
        self.settle_s = settle_s
        self.clock = clock
        self._last_seen: dict[Path, tuple[int, int]] = {}
        self._lock = threading.Lock()
        self.unsettled: tuple[Path, ...] = ()  # from the last scan, for status / logs
        # False while no job runs (between attempts): nothing can still be writing, so a file
        # that just appeared is as final as it will get and the settle window does not apply.
        self.writer_active = True

    def _entries(self) -> Iterable[tuple[Path, Layout, int | None]]:
        if self.follow_symlinks_out:
            return self._all_entries()
        try:
            home = self.dir.resolve()  # once a scan, not once an entry
        except (OSError, RuntimeError):
            return iter(())
        return (e for e in self._all_entries() if self._inside(e[0], home))

    @staticmethod
    def _inside(p: Path, home: Path) -> bool:
        """``p`` resolves inside the checkpoint dir ``home`` (a symlink out of it does not)."""
        try:
            return p.resolve().is_relative_to(home)
        except (OSError, RuntimeError):  # a symlink loop
            return False

    def _all_entries(self) -> Iterable[tuple[Path, Layout, int | None]]:
        seen: set[Path] = set()
        if self.glob:
            # Matches past the listing's cap are not looked at (a glob cannot be read newest first).
            for p in sorted(itertools.islice(self.dir.glob(self.glob), LISTING_CAP)):
                if QUARANTINE_DIR in p.relative_to(self.dir).parts or LAST_GOOD_DIR in p.relative_to(self.dir).parts:
                    continue
                if _skipped(p):
                    continue
                step = None
                # Searched in the path relative to dir, so the regex can read a folder name too.
                if self.step_regex and (m := self.step_regex.search(p.relative_to(self.dir).as_posix())):
                    step = int(m.group("step") if "step" in self.step_regex.groupindex else m.group(1))
                seen.add(p)
                yield p, Layout.CUSTOM, step
        try:
            listing = newest_entries(self.dir, _not_listed)
        except OSError:
            return
        self._say_capped(listing)
        children = list(listing.paths)
        not_here = registry.not_checkpoints(children)  # e.g. HF's final export beside checkpoint-N/
        for p in children:
            if p in seen or p.name in (QUARANTINE_DIR, LAST_GOOD_DIR) or p.name in not_here:
                continue
            c = classify(p)
            if c is not None:
                yield p, c[0], c[1]
        lg = self.dir / LAST_GOOD_DIR
        # A symlinked last_good is not ours (ownpaths): its files are never offered for a restart.
        if lg.is_dir() and not lg.is_symlink():
            try:
                kept = newest_entries(lg, _skipped_name).paths
            except OSError:
                kept = ()
            for p in kept:
                if classify(p) is not None:
                    yield p, Layout.LAST_GOOD, None

    def _say_capped(self, listing: Listing) -> None:
        """Once an episode (until the folder is back under its bounds): what was left out, and why."""
        with _capped_lock:
            said = self.dir in _capped
            if listing.capped:
                _capped.add(self.dir)
            else:
                _capped.discard(self.dir)
        if listing.capped and not said:
            log.warning("checkpoint_dir_listing_capped", dir=str(self.dir), read=listing.read,
                        unread=listing.unread, older=listing.older, message=listing.says(self.dir))

    def scan(self) -> list[Candidate]:
        """Complete, settled checkpoints, newest first (by step, then mtime)."""
        now = self.clock()
        out: list[Candidate] = []
        unsettled: list[Path] = []
        with self._lock:
            current: dict[Path, tuple[int, int]] = {}
            for path, layout, step in self._entries():
                try:
                    st = stat_record(path)
                except OSError:
                    continue  # vanished while we looked (renamed by its writer): next scan
                key = (st["size"], st["mtime_ns"])
                current[path] = key
                prev = self._last_seen.get(path)
                mtime = st["mtime_ns"] / 1e9
                if self.writer_active and (now - mtime < self.settle_s or (prev is not None and prev != key)):
                    unsettled.append(path)
                    continue
                out.append(Candidate(path=path, step=step, layout=layout, mtime=mtime, size=st["size"]))
            self._last_seen = current
            self.unsettled = tuple(unsettled)
        return sort_newest_first(out)


_Ranked = TypeVar("_Ranked", bound=Any)  # anything with step, layout and mtime: candidates, quicklist rows


def sort_newest_first(items: Iterable[_Ranked]) -> list[_Ranked]:
    """Candidates or quicklist rows, newest first. A step beats a mtime (copies change mtimes);
    unknown steps sort by mtime among themselves. Ties at the same step: the original before
    its last_good copy."""
    return sorted(items, key=lambda c: (c.step if c.step is not None else -1, c.layout != Layout.LAST_GOOD,
                                        c.mtime), reverse=True)


def newest_complete(cands: Iterable[Candidate]) -> Candidate | None:
    """The newest of ``cands`` (sorted newest first, as scans return them) that is the job's own
    checkpoint, not a last_good copy: the one place that says which checkpoint is the newest."""
    return next((c for c in cands if c.layout is not Layout.LAST_GOOD), None)
