"""Epoch-local counters -> global steps (pure; the log watcher calls it for every parsed record).

Many loops print where they are inside the epoch, not in the run: ``epoch 1 | iter 50 | loss nan``
with ``iter`` back at 0 every epoch. Read as the global step, that line is step 50 while the run is at
step 150 (100 iterations per epoch), and everything that reads a step goes wrong by whole epochs: the
onset of the NaN (a rollback to step 40 loses 110 steps), validation after the restart (good checkpoints
called suspect), the resume check. So a counter that belongs to an epoch becomes a global step,
``(epoch - first epoch) x iterations per epoch + counter``, learned per source from what it prints:

- *Which counters*: a record with an epoch (``extra["epoch"]``) and a counter the parser marked as
  possibly epoch-local (``extra["epoch_counter"]``: a generic line's ``iter`` / ``it`` / ``iteration`` /
  ``batch N/M`` / bare ``N/M``, a JSON line's or metric file's ``iter`` / ``iteration``). A line's
  explicit ``step`` / ``global_step`` is never marked: it wins.
  Lightning's bar (``Epoch 1: 50/100``, ``extra["batch"]`` of ``extra["total"]``) always counts the
  batches of its epoch: its period is the bar's total and its epochs count from 0. (With gradient
  accumulation Lightning's optimizer step is the batch count over the accumulation factor, which the bar
  does not show; its metric files, which carry the optimizer step, are then the better source.)
- *Its wrap*: when the epoch grows and the counter falls, the counter is epoch-local; when the epoch
  grows and the counter does not fall (and the epoch before held two records or more: a log sparser
  than an epoch proves nothing), it is global and kept as printed.
- *Iterations per epoch*, learned at a wrap from epoch e to e + 1: the printed total (``iter 50/100``)
  when the counter shows one; else, when the new epoch's first counter is past 1 (a log on the global
  cadence: every k global steps, wherever the epoch starts), ``last + k - first`` exactly (k: the
  smallest gap between two counters of an epoch); else ``last + 1 - first``: the fewest iterations the
  epoch can have held (a log that restarts with the epoch, every k iterations, shows 0 .. 90 of 100).
  Once a wrap has shown the global cadence, later wraps are read on it too (an epoch that happens to
  start on a logged step shows 0). Several wraps: the smallest, an exact one before a bound. So a global step read here is exact or early, never late: a rollback
  before an early onset costs steps, one after a late onset keeps the poison.
- Until the first wrap the first epoch's counter is its global step; a later epoch's is unknown
  (step None: the watcher takes the last step it knows, as for any stepless line). What was learned
  carries over to later attempts of the run (a resumed attempt may see no wrap before its NaN). The
  first epoch (0 or 1) is taken from a fresh attempt; a source first seen in a resumed attempt has
  none, and its epoch-local counters stay stepless until a fresh attempt shows it.

Bounded: at most :data:`MAX_SOURCES` sources are remembered (the oldest is forgotten).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ..core.observations import MetricRecord

COUNTER_KEY = "epoch_counter"  # extra: the counter as printed (set by the parser, kept here)
CONVERTED_KEY = "step_from_epoch"  # extra: 1.0 when the step was computed here
MAX_SOURCES = 64
MAX_STEP = 2**53  # a step past this (a crafted epoch of 1e15) is no step: JSON and SQLite keep it exactly


@dataclass
class _Counter:
    """What one source's counter has shown."""

    local: bool | None = None  # None: not known yet
    period: int | None = None  # iterations per epoch, once learned
    first_epoch: int | None = None
    epoch: int | None = None  # this attempt's current epoch
    first: int = 0  # its first counter
    top: int = 0  # its highest counter
    records: int = 0  # in the current epoch
    stride: int | None = None  # smallest gap between two counters of one epoch
    cadence: bool = False  # a wrap showed the log follows the global step (a new epoch's first counter past 1)
    exact: bool = False  # the period is the printed total, or read on the global cadence


def _whole(v: float | None) -> int | None:
    if v is None or not math.isfinite(v) or v < 0 or not float(v).is_integer():
        return None
    return int(v)


class EpochSteps:
    """Per-source counters; ``globalize(source, rec)`` returns the record with its global step."""

    def __init__(self) -> None:
        self._by: dict[str, _Counter] = {}
        self._fresh = True

    def reset(self, resume_step: int | None) -> None:
        """A new attempt: the epoch tracking starts over; what was learned stays."""
        self._fresh = not resume_step
        for c in self._by.values():
            c.epoch, c.first, c.top, c.records = None, 0, 0, 0

    def globalize(self, source: str, rec: MetricRecord) -> MetricRecord:
        extra = rec.extra
        if "epoch" not in extra:
            return rec
        epoch = _whole(extra["epoch"])
        if epoch is None:
            return rec
        if rec.fmt == "lightning":
            counter, total = _whole(extra.get("batch")), _whole(extra.get("total"))
            if not counter or not total:
                return rec  # a bar at 0 has done nothing yet (redrawn for a new epoch under the old name)
            c = self._counter(source + "\0bar", epoch)
            c.local, c.period, c.first_epoch = True, total, 0  # the bar counts its epoch's batches
        elif COUNTER_KEY in extra:
            counter, total = _whole(extra[COUNTER_KEY]), _whole(extra.get("total"))
            if counter is None:
                return rec
            c = self._counter(source, epoch)
            self._learn(c, epoch, counter, total)
        else:
            return rec
        step = self._step(c, epoch, counter)
        if step is not None and step > MAX_STEP:
            step = None
        if step == rec.step:
            return rec
        flag = {CONVERTED_KEY: 1.0} if step is not None else {}
        return dataclasses.replace(rec, step=step, extra={**extra, **flag})

    def _counter(self, key: str, epoch: int) -> _Counter:
        c = self._by.get(key)
        if c is None:
            if len(self._by) >= MAX_SOURCES:
                self._by.pop(next(iter(self._by)))
            c = self._by[key] = _Counter()
        if c.first_epoch is None and self._fresh:
            c.first_epoch = epoch if epoch <= 1 else 0
        return c

    @staticmethod
    def _learn(c: _Counter, epoch: int, counter: int, total: int | None) -> None:
        if c.epoch is None or epoch < c.epoch:
            c.epoch, c.first, c.top, c.records = epoch, counter, counter, 1
            return
        if epoch == c.epoch:
            gap = counter - c.top
            if gap > 0:
                c.stride = gap if c.stride is None else min(c.stride, gap)
            c.top = max(c.top, counter)
            c.records += 1
            return
        if counter < c.top:
            c.local = True
            if epoch == c.epoch + 1:
                if total and c.top <= total:
                    period, exact = total, True
                elif counter > 1 or c.cadence:
                    c.cadence = True
                    period, exact = c.top + (c.stride or 1) - counter, True
                else:
                    period, exact = c.top + 1 - counter, False
                if c.period is None or (exact and not c.exact) or (exact == c.exact and period < c.period):
                    c.period, c.exact = period, exact
        elif c.local is None and c.records >= 2:
            c.local = False
        c.epoch, c.first, c.top, c.records = epoch, counter, counter, 1

    @staticmethod
    def _step(c: _Counter, epoch: int, counter: int) -> int | None:
        if c.local is False:
            return counter
        if c.first_epoch is None:
            return None  # first seen in a resumed attempt: which epoch counts from 0 is not known
        if c.local and c.period:
            return max(0, epoch - c.first_epoch) * c.period + counter
        if epoch <= c.first_epoch:
            return counter
        return None
