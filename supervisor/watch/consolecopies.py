"""Files that copy the daemon's own console: ``wrap -- python train.py | tee train.log``.

The daemon's stdout carries the job's lines and the daemon's narration. Where it is a regular
file its identity names it (:func:`.candidates.own_output`); where it is a pipe, whoever reads
the pipe may write it to a file in the job's tree (``tee train.log``), which the metric-file walk
would take for the job's text log: every metric twice, the daemon's own words read as the job's.

Chosen over recognising our echoed lines (the job's lines are echoed verbatim, so a copy cannot
be told from the job's own log by its content) and over "a file not written by the job's tree"
(a job that opens its log per write holds it open only for a moment): the readers of our console
pipe are found in ``/proc`` (a process holding the pipe's read end; our own ends are write ends),
and the regular files they hold open for writing are ours. Linux only; elsewhere, or when the
readers are another user's, nothing is found and the walk is as before.

Bounded: nothing at all unless fd 1 or 2 is a pipe; the search lists at most ``MAX_PIDS``
processes of our uid and reads at most ``MAX_FDS`` descriptor links, and runs only when a file
new to the walk is not already known as a copy and was changed after the last search (a copy's
writer has it open before it exists); the readers found are kept and only their descriptors are
read again.
"""

from __future__ import annotations

import itertools
import os
import stat
import time
from typing import Sequence

PROC = "/proc"
#: Processes looked at per search, and descriptor links read per search (a node's whole process
#: table is not read: a few thousand processes of one user at most).
MAX_PIDS = 4096
MAX_FDS = 65536


def _pipe_links(fds: Sequence[int]) -> set[str]:
    """``pipe:[inode]`` of each of ``fds`` that is a pipe (as ``/proc/PID/fd`` links name it)."""
    out: set[str] = set()
    for fd in fds:
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if stat.S_ISFIFO(st.st_mode):
            out.add(f"pipe:[{st.st_ino}]")
    return out


def _mode(pid: str, fd: str) -> int | None:
    """The access mode (``O_ACCMODE`` bits) ``fd`` of ``pid`` was opened with."""
    try:
        with open(f"{PROC}/{pid}/fdinfo/{fd}", "rb") as fh:
            for line in fh.read(4096).splitlines():
                if line.startswith(b"flags:"):
                    return int(line.split()[1], 8) & os.O_ACCMODE
    except (OSError, ValueError, IndexError):
        return None
    return None


class ConsoleCopies:
    """The identities (device, inode) of the files the readers of our console pipe write."""

    def __init__(self, fds: Sequence[int] = (1, 2), proc: str = PROC) -> None:
        self._pipes = _pipe_links(fds)
        self._proc = proc
        self._readers: set[str] = set()
        self._searched_at = float("-inf")  # wall time of the last search of /proc
        self.searches = 0

    def holds(self, ident: tuple[int, int], changed_at: float) -> bool:
        """Whether the file ``ident`` (last changed at wall time ``changed_at``) is a copy of our
        console. Searches again only when it may have been made since the last search."""
        if not self._pipes:
            return False
        if ident in self._written():
            return True
        if changed_at < self._searched_at:
            return False
        self._search()
        return ident in self._written()

    def identities(self) -> set[tuple[int, int]]:
        """Every file the readers of our console pipe write now (one search of /proc): for a
        one-off look such as metrics_blind's list of the files an attempt wrote."""
        if not self._pipes:
            return set()
        self._search()
        return self._written()

    def _search(self) -> None:
        self._searched_at = time.time()
        self.searches += 1
        uid, me, budget, looked = os.geteuid(), str(os.getpid()), MAX_FDS, 0
        readers: set[str] = set()
        try:
            with os.scandir(self._proc) as it:
                pids = [p for p in itertools.islice(it, 1 << 16) if p.name.isdigit()]
        except OSError:
            return
        for entry in pids:
            if looked >= MAX_PIDS or budget <= 0:
                break
            if entry.name == me or _uid(entry.path) != uid:
                continue  # a pipeline's reader runs as we do
            looked += 1
            for fd, link in self._links(entry.name, budget):
                budget -= 1
                if link in self._pipes and _mode(entry.name, fd) == os.O_RDONLY:
                    readers.add(entry.name)
                    break
        self._readers = readers

    def _links(self, pid: str, budget: int) -> list[tuple[str, str]]:
        try:
            with os.scandir(f"{self._proc}/{pid}/fd") as it:
                fds = list(itertools.islice(it, max(0, budget)))
        except OSError:  # gone
            return []
        out = []
        for e in fds:
            try:
                out.append((e.name, os.readlink(e.path)))
            except OSError:
                continue
        return out

    def _written(self) -> set[tuple[int, int]]:
        """What the known readers hold open for writing, regular files only."""
        ids: set[tuple[int, int]] = set()
        for pid in list(self._readers):
            links = self._links(pid, 1024)
            if not links:
                self._readers.discard(pid)  # gone
                continue
            for fd, _link in links:
                if _mode(pid, fd) not in (os.O_WRONLY, os.O_RDWR):
                    continue
                try:
                    st = os.stat(f"{self._proc}/{pid}/fd/{fd}")
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    ids.add((st.st_dev, st.st_ino))
        return ids


def _uid(path: str) -> int:
    try:
        return os.stat(path).st_uid
    except OSError:
        return -1


__all__ = ["ConsoleCopies", "MAX_FDS", "MAX_PIDS"]
