"""The job's process tree, walked off the main loop.

Why a thread: psutil finds descendants from a parent map of every process on the host (one read
of ``/proc/<pid>/stat`` each), and every read gives up the GIL. While the output thread parses a
burst (CPU-bound), each read then waits out a switch interval to get the GIL back: the two walks
of a refresh (the leader's tree, the daemon's orphans) over ~70 host processes held the main loop,
and every control reply waiting on it, for 150-340 ms. The walk now runs on one worker thread and
the loop takes its result at a later refresh (one walk in flight at a time, so a result is at most
about a refresh interval old, as before). The stop path still walks at once: it acts on the tree.
Where the job has a cgroup of its own, its members are read from ``cgroup.procs`` instead and the
periodic walk is not needed (process.py).
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Iterable

import structlog

from .osapi import OsApi, ProcRef

log = structlog.get_logger("supervisor.job.treewalk")


def orphans(refs: Iterable[ProcRef], markers: Iterable[tuple[bytes, ...]], skip: Iterable[int]) -> list[ProcRef]:
    """Of the daemon's own descendants ``refs`` (re-parented to it, the subreaper), those whose
    environment carries every entry of one of ``markers`` (``TSUP_RUN_ID=...`` and
    ``TSUP_ATTEMPT=...``; or the ``TSUP_STANDBY=...`` of the prewarm runner the attempt runs in),
    except the pids in ``skip``."""
    wants = [m for m in markers if m]
    known = set(skip)
    found = []
    for ref in refs:
        if ref.pid in known:
            continue
        try:
            with open(f"/proc/{ref.pid}/environ", "rb") as f:
                env = set(f.read().split(b"\0"))
        except OSError:
            continue
        if any(all(m in env for m in want) for want in wants):
            found.append(ref)
    return found


def walk(osapi: OsApi, leader: int | None, markers: tuple[tuple[bytes, ...], ...],
         skip: frozenset[int]) -> list[ProcRef]:
    """Every process of the job that a walk can see: the leader's descendants (while it runs:
    ``leader`` None once it exited) and, with ``markers`` (each one full: process.py), the orphans
    that carry one of them (one pass over /proc for both)."""
    me = os.getpid()
    roots = tuple(r for r in (leader, me if markers else None) if r is not None)
    if not roots:
        return []
    trees = osapi.descendants_of(roots)
    refs = list(trees[leader]) if leader is not None else []
    if markers:
        refs += orphans(trees[me], markers, skip | {r.pid for r in refs})
    return refs


class TreeWalker:
    """Runs :func:`walk` on a thread of its own (``job-tree-walk``); the caller polls."""

    def __init__(self, osapi: OsApi) -> None:
        self.osapi = osapi
        self._pool: ThreadPoolExecutor | None = None
        self._walk: Future[list[ProcRef]] | None = None

    def poll(self, leader: int | None, markers: tuple[tuple[bytes, ...], ...],
             skip: frozenset[int]) -> list[ProcRef]:
        """What the last walk found, once it finished (else nothing yet); starts the next walk
        with these arguments when none is in flight."""
        found: list[ProcRef] = []
        if self._walk is not None:
            if not self._walk.done():
                return found
            try:
                found = self._walk.result()
            except Exception as e:  # a walk that fails leaves the tree as it was; the next one tries again
                log.warning("job_tree_walk_failed", error=repr(e),
                            message="a walk of the job's process tree failed; the next refresh walks again")
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="job-tree-walk")
        self._walk = self._pool.submit(walk, self.osapi, leader, markers, skip)
        return found

    def close(self) -> None:
        """No new walk; one in flight finishes on its own (a /proc walk ends within a second)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        self._walk = None
