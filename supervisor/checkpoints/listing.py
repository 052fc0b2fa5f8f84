"""The checkpoint dir's listing, bounded (issue 34 part 3): what discovery and ``checkpoints``
look at of a folder that may hold 100,000 entries.

A checkpoint dir is the job's: a run that saves every step and keeps them all, or one that writes
its logs there, fills it with tens of thousands of entries. Classifying an entry costs a few stats
(its layout's markers, its size, where a link leads), about half a millisecond, on the daemon's
loop every settle window; so the whole folder is never classified. At most ``LISTING_CAP`` entries
are read (one ``scandir``, a name and an ``lstat`` each), and of those the ``NEWEST_KEPT`` written
last (a heap of that size, never the whole listing) are looked at: the checkpoint a run resumes from is among the newest, and the temp names and
the supervisor's own sidecars (manifests, notes) are left out before they count.
"""
from __future__ import annotations

import heapq
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

#: Entries of the checkpoint dir read a scan (names and an lstat each); the rest is not read.
LISTING_CAP = 20_000
#: Of the entries read, the newest (by mtime) looked at as checkpoints; older ones are not offered.
NEWEST_KEPT = 1_000


@dataclass(frozen=True)
class Listing:
    """The entries to look at, sorted by name, and what the bounds left out."""

    paths: tuple[Path, ...]
    read: int  # entries read of the folder (skipped names included)
    unread: bool  # the folder has more than LISTING_CAP entries: the rest was not read
    older: int  # entries read but older than the NEWEST_KEPT looked at

    @property
    def capped(self) -> bool:
        return self.unread or self.older > 0

    def says(self, folder: Path) -> str:
        """What the bounds left out, and what follows, for a warning."""
        part = (f"more than {LISTING_CAP:,} entries: only the first {LISTING_CAP:,} (in the folder's own order) "
                "were read" if self.unread else f"{self.read:,} entries")
        return (f"the checkpoint dir {folder} has {part}, and only the newest {NEWEST_KEPT:,} of them are looked "
                f"at as checkpoints ({self.older:,} older ones are not offered for a resume); move old "
                "checkpoints or other files out of it, or set checkpoints.glob to the checkpoints' own names")


def newest_entries(folder: Path, skip: Callable[[str], bool] = lambda name: False) -> Listing:
    """At most ``NEWEST_KEPT`` entries of ``folder`` not ``skip``-ped by name, the newest by mtime
    among the first ``LISTING_CAP`` read; held as a heap of that size while the listing streams.
    Raises OSError when the folder cannot be listed."""
    heap: list[tuple[int, str]] = []  # (mtime_ns, name), the oldest kept on top
    read = dated = 0
    unread = False
    with os.scandir(folder) as it:
        for e in it:
            if read >= LISTING_CAP:
                unread = True
                break
            read += 1
            if skip(e.name):
                continue
            try:
                item = (e.stat(follow_symlinks=False).st_mtime_ns, e.name)
            except OSError:
                continue  # gone since the listing (renamed by its writer): the next scan sees the new name
            dated += 1
            if len(heap) < NEWEST_KEPT:
                heapq.heappush(heap, item)
            elif item > heap[0]:
                heapq.heapreplace(heap, item)
    base = Path(folder)
    return Listing(paths=tuple(sorted(base / name for _, name in heap)), read=read, unread=unread,
                   older=dated - len(heap))
