"""Signs of a divergence before the NaN, from the metrics already parsed (pure: records in,
verdicts out; the clock is each record's own time).

A NaN or a spike is seen when it has happened; its rollback lands on the last save before it,
up to a whole save interval back. Divergences are often announced: the grad norm climbs for a
few steps, AMP halves its loss scale again and again, the loss creeps up. Acting on that (a
``checkpoint-now`` request) saves a state a few steps before the onset, and the rollback loses
those few steps instead of the interval. The thresholds are robust (median and MAD of the run's
own recent records) and need several records in a row, so a healthy run's noise asks for nothing.
"""
from __future__ import annotations

import math
import bisect
from collections import deque
from dataclasses import dataclass
from typing import Callable

from ..core.observations import MetricRecord
from .config import PrecursorConfig

SCALE_KEYS = ("loss_scale", "scale")


@dataclass(frozen=True)
class Precursor:
    """One sign worth a checkpoint: what, at which step, and the numbers behind it."""

    kind: str  # "grad_norm_ramp", "loss_scale_drops", "loss_rising"
    step: int | None
    reason: str


class _Robust:
    """A rolling median and robust sigma of accepted values, and how many high ones came in a
    row; high ones are kept out of it, so a ramp cannot hide itself by moving the median."""

    def __init__(self, window: int) -> None:
        self.values: deque[float] = deque(maxlen=window)
        # The same values kept sorted, so the median is a lookup: the main loop books every metric
        # record through here (a burst of a million lines is read back at this pace).
        self._sorted: list[float] = []
        self.streak = 0

    def observe(self, value: float, min_points: int, high: Callable[[float, float], bool],
                could_be_high: Callable[[float], bool]) -> float | None:
        """The baseline's median when ``high(median, sigma)`` says ``value`` is high (the streak
        grows), else None (the streak ends and the value joins the baseline). ``could_be_high(median)``
        is a condition ``high`` needs whatever the sigma: when it is false the MAD is not computed
        (most healthy records stop there: the main loop books every record through here)."""
        if len(self.values) < min_points:
            self.accept(value)
            return None
        med = _middle(self._sorted)
        if could_be_high(med) and high(med, self.sigma(med)):
            self.streak += 1
            return med
        self.streak = 0
        self.accept(value)
        return None

    def accept(self, value: float) -> None:
        """``value`` joins the baseline unjudged."""
        if len(self.values) == self.values.maxlen:
            del self._sorted[bisect.bisect_left(self._sorted, self.values[0])]
        self.values.append(value)
        bisect.insort(self._sorted, value)

    def stats(self) -> tuple[float, float]:
        """The median and 1.4826 x the median absolute deviation (as statistics.median computes them)."""
        med = _middle(self._sorted)
        return med, self.sigma(med)

    def sigma(self, med: float) -> float:
        """1.4826 x the median absolute deviation from ``med`` (the baseline's median), read off the
        sorted values: the deviations below the median and those above it are two sorted runs, so
        their middle is found by bisection, without sorting the deviations (the same figure)."""
        s = self._sorted
        n = len(s)
        split = bisect.bisect_left(s, med)
        h = n // 2
        mad = _nth_deviation(s, med, split, h)
        if not n % 2:
            mad = (_nth_deviation(s, med, split, h - 1) + mad) / 2
        return 1.4826 * mad


def _middle(ordered: list[float]) -> float:
    n = len(ordered)
    h = n // 2
    return ordered[h] if n % 2 else (ordered[h - 1] + ordered[h]) / 2


def _nth_deviation(s: list[float], med: float, split: int, t: int) -> float:
    """The ``t``-th smallest (from 0) of ``abs(v - med)`` over the sorted ``s``: the deviations of
    ``s[:split]`` (below ``med``) grow leftwards and those of ``s[split:]`` rightwards, two sorted runs
    A and B; bisect how many of the t + 1 smallest come from A (``med - v`` is exactly ``abs(v - med)``
    there: rounding is symmetric)."""
    na, nb = split, len(s) - split
    lo, hi = max(0, t + 1 - nb), min(t + 1, na)
    while lo < hi:  # the fewest taken from A such that A's next is not below B's last taken
        i = (lo + hi) // 2
        j = t + 1 - i
        if med - s[split - 1 - i] < s[split + j - 1] - med:
            lo = i + 1
        else:
            hi = i
    j = t + 1 - lo
    from_a = med - s[split - lo] if lo else float("-inf")
    from_b = s[split + j - 1] - med if j else float("-inf")
    return from_a if from_a > from_b else from_b


class PrecursorWatch:
    """Feed it an attempt's metric records in order; it says when a precursor is seen."""

    def __init__(self, cfg: PrecursorConfig) -> None:
        self.cfg = cfg
        self.reset(None)
        self._last_fired_at = float("-inf")

    def reset(self, resume_step: int | None) -> None:
        """A new attempt: its own baseline, from its own records."""
        self._start = resume_step
        self._first: int | None = None
        self._grad = _Robust(self.cfg.window)
        self._loss = _Robust(self.cfg.window)
        # (record index, scale) of the window's scales that no newer one is as high as: a sliding maximum
        self._scales: deque[tuple[int, float]] = deque()
        self._n = 0

    def feed(self, rec: MetricRecord) -> Precursor | None:
        if not self.cfg.enabled:
            return None
        self._n += 1
        if rec.step is not None and self._first is None:
            self._first = rec.step
        base = self._start if self._start is not None else self._first
        if rec.step is not None and base is not None and rec.step - base < self.cfg.warmup_steps:
            self._accept(rec)
            return None
        found = self._judge(rec)
        if found is None:
            return None
        if rec.at - self._last_fired_at < self.cfg.min_interval_s:
            return None
        self._last_fired_at = rec.at
        return found

    def _accept(self, rec: MetricRecord) -> None:
        if rec.grad_norm is not None and _finite(rec.grad_norm):
            self._grad.accept(rec.grad_norm)
        if rec.loss is not None and _finite(rec.loss):
            self._loss.accept(rec.loss)
        self._note_scale(rec)

    def _note_scale(self, rec: MetricRecord) -> int:
        """How many halvings the loss scale is below its highest value within the window, this
        record's included. AMP halves it on an overflow and doubles it back after a stretch of
        clean steps: a lone halving is routine, a scale that keeps falling is not."""
        scale = next((rec.extra[k] for k in SCALE_KEYS if k in rec.extra), None)
        scales = self._scales  # decreasing scales: the first is the window's highest, the last the newest
        if scale is not None and _finite(scale) and scale > 0:
            while scales and scales[-1][1] <= scale:
                scales.pop()  # never the highest again while this newer one is in the window
            scales.append((self._n, scale))
        while scales and self._n - scales[0][0] >= self.cfg.window:
            scales.popleft()  # out of the window for good: the record index only grows
        if not scales:
            return 0
        return int(math.floor(math.log2(scales[0][1] / scales[-1][1]) + 1e-9))

    def _judge(self, rec: MetricRecord) -> Precursor | None:
        cfg = self.cfg
        found: Precursor | None = None
        g = rec.grad_norm
        if g is not None and _finite(g):
            med = self._grad.observe(g, cfg.min_points, lambda m, s: g > m + cfg.grad_norm_z * s,
                                     lambda m: g > cfg.grad_norm_factor * m)
            if med is not None and self._grad.streak >= cfg.patience:
                found = Precursor("grad_norm_ramp", rec.step,
                                  f"grad norm {g:.4g} above {cfg.grad_norm_factor:g}x its median {med:.4g} "
                                  f"for {self._grad.streak} records in a row")
        loss = rec.loss
        if found is None and loss is not None and _finite(loss):
            # loss_z > 0 and sigma >= 0: a loss at or below the median is never high
            med = self._loss.observe(loss, cfg.min_points, lambda m, s: s > 0 and loss > m + cfg.loss_z * s,
                                     lambda m: loss > m)
            if med is not None and self._loss.streak >= cfg.patience:
                found = Precursor("loss_rising", rec.step,
                                  f"loss {loss:.4g} above its median {med:.4g} by more than {cfg.loss_z:g} "
                                  f"robust sigmas for {self._loss.streak} records in a row")
        drops = self._note_scale(rec)
        if found is None and drops >= cfg.scale_drops:
            found = Precursor("loss_scale_drops", rec.step,
                              f"the AMP loss scale fell {2 ** drops}x (halved {drops} times without recovering) "
                              f"within {cfg.window} records")
            self._scales.clear()
        return found


def _finite(x: float) -> bool:
    return x == x and x not in (float("inf"), float("-inf"))
