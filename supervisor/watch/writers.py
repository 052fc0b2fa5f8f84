"""Whose is a text log found in the job's tree: the job's, or a file someone else writes there.

The metric-file walk takes every ``*.log`` / ``*.txt`` under the working dir for a text log of the
job. A file the job never wrote (an operator's ``notes.txt`` holding ``step 4 loss nan``, another
tool's ``notes.log``) must not roll back or end a healthy run (issue 34, X1). So a non-finite value
read from a text log is acted on only when the file is the job's:

- **Held open by the job** (the writer's identity): a process of the job's tree (the attempt's
  leader and its descendants) holds it open, seen in ``/proc/<pid>/fd``. Looked for when such a
  file yields records (at most every ``SCAN_EVERY_S``, backing off to ``SCAN_BACKOFF_MAX_S`` while
  it is not found) and before the first non-finite value from it is judged. Once seen, the file
  (path and identity) is the job's for the rest of the run. A ``logging.FileHandler``, loguru, a
  file kept open by the loop: found at the first look.
- **Else, its own history**: a writer that opens, appends and closes per step is never seen
  holding it. Such a file is trusted when it carried the job's progress: at least
  ``MIN_STEPS`` records with a finite value and a step, read before the non-finite one (a loop
  that logs every step; ``step 1..29`` then ``step 30 loss nan`` written in the job's last moment);
  counted over the run, so a resumed attempt whose first record is a NaN is still acted on.
  A file that fails both is not acted on: ``metric_file_untrusted`` (a warning, once per file and
  attempt) names it, says why and how to have it trusted (name it in ``[job] watch_files``: the
  tailer reads it and its NaNs are acted on, as with every file the config names).

Only non-finite records are held back; the file's other records go to the detectors as before
(progress, step rhythm, loss spikes: a spike needs tens of records of one file anyway). Other
kinds of metric files (TensorBoard, CSV with a loss header, JSONL with loss keys, MLflow) are
narrow matches and are not judged here.

Bounded: a look lists the job's tree from one pass over ``/proc`` (a parent link each, psutil's
cost of ``children(recursive=True)``), then reads the fd links of at most ``MAX_PIDS`` processes,
``MAX_FDS`` links in all; at most ``MAX_KNOWN`` files are remembered. Linux only; without ``/proc`` nothing is ever seen held open and the
history rule alone decides.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import psutil
import structlog

from ..core.observations import MetricRecord
from .nannotes import NAN_ITERATIONS

log = structlog.get_logger("supervisor.watch")

PROC = "/proc"
MAX_PIDS = 64
MAX_FDS = 4096
SCAN_EVERY_S = 1.0
SCAN_BACKOFF_MAX_S = 30.0
MIN_STEPS = 2
MAX_KNOWN = 4096
_FIELDS = ("loss", "grad_norm", "lr", "tokens_per_sec", "val_loss")


def alarming(rec: MetricRecord) -> bool:
    """Whether ``rec`` holds a value a NaN detector acts on (non-finite, or Megatron's nan count)."""
    for name in _FIELDS:
        v = getattr(rec, name)
        if v is not None and not math.isfinite(v):
            return True
    return rec.extra.get(NAN_ITERATIONS, 0) > 0 or any(not math.isfinite(v) for v in rec.extra.values())


@dataclass
class _Evidence:
    """What one file not yet known as the job's showed (kept across attempts: a log the job
    appended its steps to in one attempt is still its log in the next)."""

    real: str  # its real path, as /proc's fd links name it
    steps: int = 0  # finite records with a step
    looked: bool = False  # looked for in the job's open files this attempt
    warned: bool = False  # said untrusted this attempt


def job_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (at most ``MAX_PIDS``); ``[]`` when ``pid`` is gone."""
    try:
        proc = psutil.Process(pid)
        kids = [c.pid for c in proc.children(recursive=True)]
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return []
    return [pid, *kids][:MAX_PIDS]


def held_open(pids: Sequence[int], paths: set[str], proc: str = PROC) -> set[str]:
    """Those of ``paths`` (real paths) that one of ``pids`` holds open (at most ``MAX_FDS`` links read)."""
    found: set[str] = set()
    budget = MAX_FDS
    for pid in pids:
        if budget <= 0 or found == paths:
            break
        try:
            with os.scandir(f"{proc}/{pid}/fd") as it:
                fds = [e.path for _, e in zip(range(budget), it)]
        except OSError:  # gone, or not ours to read
            continue
        budget -= len(fds)
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target in paths:
                found.add(target)
    return found


class Writers:
    """Judges the records of text logs (``admit``) for :class:`~.metricfiles.MetricFiles`; its
    reader thread alone calls ``admit``, the loop calls ``attempt``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, proc: str = PROC,
                 tree: Callable[[int], list[int]] = job_tree) -> None:
        self.clock, self.proc, self.tree = clock, proc, tree
        self._pid: int | None = None
        self._trusted: dict[tuple[str, tuple[int, int]], None] = {}  # (path, (dev, ino)): the job's, for the run
        self._evidence: dict[tuple[str, tuple[int, int]], _Evidence] = {}
        self._next_scan = 0.0
        self._gap = SCAN_EVERY_S
        self.scans = 0
        self.withheld = 0

    def attempt(self, pid: int | None) -> None:
        """A new attempt's job (None: no job known, every record is admitted as before)."""
        for ev in self._evidence.values():
            ev.looked = ev.warned = False
        self._next_scan, self._gap, self._pid = 0.0, SCAN_EVERY_S, pid

    def admit(self, path: str, ident: tuple[int, int], kind: str, records: list[MetricRecord]) -> list[MetricRecord]:
        """``records`` read from ``path`` less the non-finite ones the job is not known to have written."""
        key = (path, ident)
        if self._pid is None or kind != "log" or key in self._trusted:
            return records
        ev = self._evidence.get(key)
        if ev is None:
            ev = self._evidence[key] = _Evidence(os.path.realpath(path))
            _bound(self._evidence)
        due = self.clock() >= self._next_scan or (not ev.looked and any(map(alarming, records)))
        if due and self._look(key):
            return records
        out: list[MetricRecord] = []
        for rec in records:
            if not alarming(rec):
                ev.steps += rec.step is not None
                out.append(rec)
            elif ev.steps >= MIN_STEPS:
                out.append(rec)  # the job's progress was written here: it is its log
            else:
                self.withheld += 1
                if not ev.warned:
                    ev.warned = True
                    self._warn(path, rec, ev.steps)
        if ev.steps >= MIN_STEPS:
            self._trust(key)
        return out

    def _trust(self, key: tuple[str, tuple[int, int]]) -> None:
        self._evidence.pop(key, None)
        self._trusted[key] = None
        _bound(self._trusted)

    def _look(self, key: tuple[str, tuple[int, int]]) -> bool:
        """Look for the files not yet known as the job's in its open files; whether ``key`` was found."""
        assert self._pid is not None
        self.scans += 1
        found = held_open(self.tree(self._pid), {ev.real for ev in self._evidence.values()}, self.proc)
        for k, ev in list(self._evidence.items()):
            ev.looked = True
            if ev.real in found:
                self._trust(k)
        if key in self._trusted:
            return True
        self._next_scan = self.clock() + self._gap
        self._gap = min(SCAN_BACKOFF_MAX_S, self._gap * 2)
        return False

    def _warn(self, path: str, rec: MetricRecord, steps: int) -> None:
        log.warning("metric_file_untrusted", path=path, step=rec.step,
                    why=f"no process of the job was seen holding it open, and it logged {steps} step(s) before "
                        f"the non-finite value ({MIN_STEPS} needed): it may be a file the job never wrote",
                    next=f"the run goes on; a non-finite value in this file is acted on once the job is seen "
                         f"writing it (holding it open, or {MIN_STEPS} steps logged there first). If the job writes "
                         "it, name it in [job] watch_files: its lines are then read and acted on")


def _bound(table: dict[Any, Any]) -> None:
    """At most ``MAX_KNOWN`` files remembered: the oldest is forgotten (a job that makes a new log
    every step must not grow the table for the life of the daemon)."""
    while len(table) > MAX_KNOWN:
        del table[next(iter(table))]


__all__ = ["MIN_STEPS", "Writers", "alarming", "held_open", "job_tree"]
