"""The files a job writes while no metric is read from it: where its metrics may be instead.

``metrics_blind`` names them (the fix: ``--watch-file`` for a text log, the client library for a
private format). Never the supervisor's own output: ``job.log``, the state dir's files and
whatever file the daemon's own stdout/stderr is redirected to (``console.log``) are told apart by
file identity (``st_dev``, ``st_ino``), so a hard link, a symlinked path or a redirect into the
working dir is excluded too, whatever it is called.

Bound: one walk of at most :data:`MAX_WALK` entries, :data:`DEPTH` levels below each root, once
per run (when the notice is due).
"""

from __future__ import annotations

import itertools
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from ..job.keeper import rotated_logs
from ..textescape import escaped

#: What a job's own text log or metric file is called (a --watch-file can follow it).
TEXT_SUFFIXES = (".log", ".txt", ".out", ".jsonl", ".json", ".csv")
#: Metric stores read by the metric-file follower or by a tool of their own.
STORE_MARKS = (".tfevents.", ".db", ".sqlite", ".parquet", ".wandb")
#: Checkpoints and caches: written by the job, never where its metrics are.
NOT_METRICS = (".pt", ".pth", ".ckpt", ".safetensors", ".bin", ".distcp", ".pyc", ".lock", ".tmp", ".npz")
MAX_WALK = 500
DEPTH = 3
NAME_CHARS = 200


@dataclass(frozen=True)
class Written:
    """A file the attempt wrote: ``kind`` text (a --watch-file can follow it), store (a metric
    store) or other (a format of the job's own)."""

    name: str  # relative to the working dir when under it
    kind: str
    mtime: float


def kind_of(name: str) -> str | None:
    if name.endswith(NOT_METRICS):
        return None
    if name.endswith(TEXT_SUFFIXES):
        return "text"
    if any(mark in name for mark in STORE_MARKS):
        return "store"
    return "other"


def said(name: str) -> str:
    """A file name as a message may carry it: control and format characters escaped by the one
    escaper (a newline in a name must not forge a console or journal line, a bidi override must
    not make its end look like its start), at most :data:`NAME_CHARS` characters."""
    out = escaped(name)
    return out if len(out) <= NAME_CHARS else out[:NAME_CHARS - 1] + "…"


def file_id(st: os.stat_result) -> tuple[int, int]:
    return (st.st_dev, st.st_ino)


def own_output(state_dir: Path | None, extra: Iterable[Path] = (), fds: Sequence[int] = (1, 2)) -> set[tuple[int, int]]:
    """The identities of the supervisor's own output files: its stdout/stderr where they are
    regular files (``run ... > console.log 2>&1``), every file in the state dir (``job.log``,
    ``job.stderr.log``, the ledger), and ``extra`` (the configured log file, and its rotated ones)."""
    ids: set[tuple[int, int]] = set()
    for fd in fds:
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            ids.add(file_id(st))
    paths = [p for e in extra for p in (e, *map(Path, rotated_logs(str(e))))]  # job.log.1 ...: the keeper's
    if state_dir is not None:
        try:
            paths += [Path(e.path) for e in os.scandir(state_dir)]
        except OSError:
            pass
    for p in paths:
        try:
            st = os.stat(p)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            ids.add(file_id(st))
    return ids


def written_files(roots: Sequence[Path], since: float, own: set[tuple[int, int]],
                  skip_dirs: Sequence[Path] = (), depth: int = DEPTH) -> list[Written]:
    """Files under ``roots`` (at most ``depth`` levels) modified at or after wall time ``since``,
    newest first, that are not the supervisor's own (``own``) nor checkpoints or caches; names
    relative to the first root when under it."""
    found: dict[tuple[int, int], Written] = {}
    skip = {os.path.realpath(p) for p in skip_dirs}  # the state dir's heartbeats/, stacks/
    base = str(roots[0]) if roots else ""
    seen = 0
    todo: list[tuple[str, int]] = [(str(r), 0) for r in roots]
    while todo and seen < MAX_WALK:
        folder, level = todo.pop()
        try:
            # Only what the walk's bound lets through is taken from the listing: a folder of
            # 1,000,000 files costs MAX_WALK entries, not a list of all of them.
            with os.scandir(folder) as it:
                entries = list(itertools.islice(it, MAX_WALK - seen + 1))
        except OSError:
            continue
        for e in entries:
            seen += 1
            if seen > MAX_WALK:
                break
            if e.name.startswith(".") or e.name == "__pycache__":
                continue
            try:
                if e.is_dir(follow_symlinks=False):
                    if level + 1 < depth and os.path.realpath(e.path) not in skip:
                        todo.append((e.path, level + 1))
                    continue
                kind = kind_of(e.name)
                if kind is None or not e.is_file(follow_symlinks=False):
                    continue
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if st.st_mtime < since or file_id(st) in own:
                continue
            rel = os.path.relpath(e.path, base) if base and e.path.startswith(base + os.sep) else e.path
            found.setdefault(file_id(st), Written(said(rel), kind, st.st_mtime))
    return sorted(found.values(), key=lambda w: -w.mtime)
