"""An attempt's work besides parsed steps, gathered for the progress rule of a blind attempt.

A job whose output no parser understands still shows that it works: it keeps printing, and it
writes checkpoints or log files. :class:`AttemptActivity` is a line sink on the output fanout
(any format, parsed or not) that keeps the distinct seconds in which lines arrived, and looks
at the files the job writes when the runner asks; the pure core judges the facts
(:func:`supervisor.core.attempts.showed_work`).
"""

from __future__ import annotations

import glob
import os
import threading
from collections import deque
from pathlib import Path
from typing import Callable, Sequence

from ..config.model import Config
from ..core.messages import ACTIVE_SECONDS_KEPT, Activity

#: Files looked at per question: a checkpoint dir of thousands of entries costs no more than this.
MAX_FILES = 2000


class AttemptActivity:
    """Thread-safe ``feed`` (the output readers); ``reset`` and ``snapshot`` on the main loop."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._started = clock()
        self._started_wall: float | None = None
        self._lines = 0
        self._last_second = -1
        self._seconds: deque[int] = deque(maxlen=ACTIVE_SECONDS_KEPT)

    def reset(self, started: float, started_wall: float) -> None:
        """A new attempt is launched (before its first line can arrive)."""
        with self._lock:
            self._started, self._started_wall = started, started_wall
            self._lines, self._last_second = 0, -1
            self._seconds.clear()

    def feed(self, source: str, lines: Sequence[str]) -> None:
        second = int(self._clock() - self._started)  # one clock read per batch: the pumps stay cheap
        with self._lock:
            self._lines += len(lines)
            if second != self._last_second and second >= 0:
                self._last_second = second
                self._seconds.append(second)

    def of_config(self, cfg: Config) -> Activity:
        """The facts now, with the files ``cfg`` names: its checkpoint dir, its ``[job] watch_files``."""
        ckpt = cfg.checkpoint_dir()
        globs = [g if os.path.isabs(g) else os.path.join(str(cfg.workdir()), g) for g in cfg.job.watch_files]
        return self.snapshot([ckpt] if ckpt is not None else [], globs)

    def snapshot(self, paths: Sequence[Path], globs: Sequence[str]) -> Activity:
        """The facts now; ``paths``: folders whose entries the job writes (the checkpoint dir),
        ``globs``: files it writes (``[job] watch_files``, absolute)."""
        with self._lock:
            lines, seconds, started_wall = self._lines, tuple(self._seconds), self._started_wall
        changed = None
        if started_wall is not None:
            newest = newest_mtime(paths, globs)
            if newest is not None and newest > started_wall:
                changed = round(newest - started_wall, 3)
        return Activity(lines, seconds, changed)


def newest_mtime(paths: Sequence[Path], globs: Sequence[str]) -> float | None:
    """The newest modification time among the entries of ``paths`` and the files of ``globs``
    (at most :data:`MAX_FILES` looked at; what cannot be read is skipped)."""
    newest: float | None = None
    seen = 0

    def look(st_mtime: float) -> None:
        nonlocal newest
        newest = st_mtime if newest is None else max(newest, st_mtime)

    for folder in paths:
        try:
            with os.scandir(folder) as it:
                for entry in it:
                    seen += 1
                    if seen > MAX_FILES:
                        return newest
                    try:
                        look(entry.stat().st_mtime)  # a folder checkpoint's mtime moves as files land in it
                    except OSError:
                        continue
        except OSError:
            continue
    for pattern in globs:
        for name in glob.iglob(pattern, recursive=True):
            seen += 1
            if seen > MAX_FILES:
                return newest
            try:
                look(os.stat(name).st_mtime)
            except OSError:
                continue
    return newest
