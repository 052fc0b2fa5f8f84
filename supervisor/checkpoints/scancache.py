"""The pickle scan's verdicts remembered while the checkpoint they judged is unchanged.

Why: the scan's verdict decides readiness (:func:`.pickledeny.scan_verdict`) and is asked for on
every ``evaluate`` (each row of the verb, the report, the daemon's choice) and every overlap
hand-over; a large checkpoint costs seconds to scan (a 150,000-entry DCP save about 20 s on the
loaded 2-core machine), and nothing about it changed since the last time.

The key is the identity of everything the scan read: for a file, its device, inode, size,
mtime_ns and ctime_ns (a rewrite in place or a replacement by rename changes one of them; ctime
cannot be set back by the job); for a folder, the same for every entry at every depth with its
relative path (the listing: a file added or removed changes it), folders' links not followed, as
the scan walks. Hashed to one digest, so a folder of 100,000 entries costs 32 bytes held. Taken
before and after the scan: a verdict is kept only when both agree (else the checkpoint changed
while it was scanned: refused now, scanned again next time), and never a transient one (a file
that could not be read now, a reader past its deadline). In memory only, ``MAX_CACHED``
checkpoints at most (the least recently asked for is forgotten first): a restart scans again.
"""
from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from pathlib import Path

from .pickledeny import Refusal
from .picklescan import MAX_ENTRIES, scan_refusal

MAX_CACHED = 256


def identity(path: Path) -> bytes | None:
    """The digest of what the scan of ``path`` reads (see the module's docstring); None when it
    cannot be told (gone, unreadable, past the scan's own entry bound): never remembered then."""
    h = hashlib.blake2b(digest_size=32)

    def add(rel: str, st: os.stat_result) -> None:
        h.update(repr((rel, st.st_mode, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)).encode())

    try:
        add("", os.stat(path))
        if not path.is_dir():
            return h.digest()
        seen = 0
        todo = [path]
        while todo:
            folder = todo.pop()
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
            seen += len(entries)
            if seen > MAX_ENTRIES:
                return None  # the scan refuses it quickly anyway
            for e in entries:
                rel = os.path.relpath(e.path, path)
                if e.is_dir(follow_symlinks=False):
                    add(rel + "/", e.stat(follow_symlinks=False))
                    todo.append(Path(e.path))
                else:  # a link to a file is read as the file it names: its identity, and the link's
                    add(rel, e.stat(follow_symlinks=False))
                    if e.is_symlink():
                        try:
                            add(rel + "->", e.stat())
                        except OSError:
                            add(rel + "-> (dangling)", e.stat(follow_symlinks=False))
    except OSError:
        return None
    return h.digest()


class _Cache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._verdicts: OrderedDict[str, tuple[bytes, Refusal | None]] = OrderedDict()
        self.scans = 0  # scans run (not answered from memory): what the tests count

    def refusal(self, path: Path) -> Refusal | None:
        key = str(path)
        before = identity(path)
        with self._lock:
            held = self._verdicts.get(key)
            if held is not None and before is not None and held[0] == before:
                self._verdicts.move_to_end(key)
                return held[1]
        with self._lock:
            self.scans += 1
        got = scan_refusal(path)
        after = identity(path)
        with self._lock:
            if before is None or after != before:
                self._verdicts.pop(key, None)
                if got is None and before is not None:
                    # Passed, but not the version on disk now: what it holds was not all read.
                    return Refusal(path.name, f"{path.name}: changed while it was checked, so it is not called "
                                              "checked yet", transient=True)
                return got
            if got is None or not got.transient:
                self._verdicts[key] = (before, got)
                self._verdicts.move_to_end(key)
                while len(self._verdicts) > MAX_CACHED:
                    self._verdicts.popitem(last=False)
        return got

    def clear(self) -> None:
        with self._lock:
            self._verdicts.clear()


_CACHE = _Cache()


def cached_refusal(path: Path) -> Refusal | None:
    """:func:`.picklescan.scan_refusal`, answered from memory while ``path`` is unchanged."""
    return _CACHE.refusal(path)


def scans_run() -> int:
    """How many scans :func:`cached_refusal` ran (not answered from memory), for tests and benches."""
    return _CACHE.scans


__all__ = ["MAX_CACHED", "cached_refusal", "identity", "scans_run"]
