"""The checkpoint interval that maximises goodput, from what the run has measured (pure).

Young (1974) and Daly (2006): with failures at a mean interval M (exponential), a save that costs
C seconds of training and a restart that costs R, a checkpoint every T seconds of work wastes
about C/T (saving) + (T + C)/(2M) (work redone after a failure) + R/M. Daly's higher-order
optimum, for C < 2M::

    T* = sqrt(2 C M) * (1 + sqrt(C / (2M)) / 3 + (C / (2M)) / 9) - C

and T* = M beyond that. ``expected_goodput`` is the exact expectation under that model (each
segment of T work + C save is retried until it runs failure-free, a restart before each retry),
which the tests check against a seeded simulation; the advice is checked against the best
interval found by searching it.

The inputs come from the ledger: M from the failures of every run in the state dir (counted
causes only: a stop or a give-up is not a failure of the hardware or the job), C from the job's
own step rhythm around its saves (the step interval that holds a save, minus the usual one), R
from launch to first step of the relaunches.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Iterable, Sequence


@dataclass(frozen=True)
class IntervalAdvice:
    """What the run measured and what it implies; seconds throughout."""

    save_cost_s: float
    mtbf_s: float
    restart_s: float
    failures: int
    current_s: float | None  # the interval between the job's saves now (median), if seen
    advised_s: float
    goodput_now: float | None  # expected goodput at the current interval
    goodput_advised: float

    def to_json(self) -> dict[str, float | int | str | None]:
        return {"summary": self.line(), "save_cost_s": round(self.save_cost_s, 3), "mtbf_s": round(self.mtbf_s, 1),
                "restart_s": round(self.restart_s, 3), "failures": self.failures,
                "current_s": round(self.current_s, 1) if self.current_s is not None else None,
                "advised_s": round(self.advised_s, 1),
                "goodput_now": round(self.goodput_now, 4) if self.goodput_now is not None else None,
                "goodput_advised": round(self.goodput_advised, 4)}

    def line(self) -> str:
        """One status line: the advice and what the current interval costs."""
        now = (f"saving every {_human(self.current_s)} costs {1 - self.goodput_now:.1%} of goodput; "
               if self.current_s is not None and self.goodput_now is not None else "")
        return (f"checkpoint interval: {now}every {_human(self.advised_s)} would cost "
                f"{1 - self.goodput_advised:.1%} (saves take {self.save_cost_s:.3g} s, "
                f"{self.failures} failure(s), one per {_human(self.mtbf_s)})")


def daly_interval(save_cost_s: float, mtbf_s: float) -> float:
    """Daly's optimum seconds of work between two saves (Young's sqrt(2CM) plus his corrections)."""
    c, m = max(save_cost_s, 0.0), mtbf_s
    if m <= 0:
        raise ValueError(f"mtbf_s must be > 0, got {m}")
    if c <= 0:
        return 0.0  # free saves: save as often as the job can
    if c >= 2 * m:
        return m
    x = c / (2 * m)
    return math.sqrt(2 * c * m) * (1 + math.sqrt(x) / 3 + x / 9) - c


def expected_goodput(interval_s: float, save_cost_s: float, mtbf_s: float, restart_s: float = 0.0) -> float:
    """Work / wall time at a checkpoint every ``interval_s`` of work, failures exponential with
    mean ``mtbf_s``: a segment (work + save) is retried, after a restart, until it runs clean.
    E[wall per segment] = e^(R/M) * M * (e^((T+C)/M) - 1)."""
    t, c, m, r = interval_s, max(save_cost_s, 0.0), mtbf_s, max(restart_s, 0.0)
    if t <= 0 or m <= 0:
        return 0.0
    exponent = (t + c) / m
    if exponent > 700:  # the segment practically never finishes
        return 0.0
    wall = math.exp(r / m) * m * math.expm1(exponent)
    return t / wall


def save_cost_from_rhythm(step_times: Sequence[float], save_times: Iterable[float]) -> float | None:
    """Seconds a save costs the job: the step interval that holds each save, minus the median
    step interval, medianed over the saves. None without enough of either."""
    ts = sorted(step_times)
    if len(ts) < 5:
        return None
    gaps = [b - a for a, b in zip(ts, ts[1:])]
    usual = statistics.median(gaps)
    costs = []
    for s in save_times:
        for a, b in zip(ts, ts[1:]):
            if a <= s < b:
                costs.append(max(0.0, (b - a) - usual))
                break
    return statistics.median(costs) if costs else None


def mtbf(run_seconds: float, failures: int) -> float | None:
    """Mean seconds between failures, or None before the first failure (no rate to act on)."""
    return run_seconds / failures if failures > 0 and run_seconds > 0 else None


def advise(*, save_cost_s: float, run_seconds: float, failures: int, restart_s: float = 0.0,
           current_s: float | None = None) -> IntervalAdvice | None:
    """The advice, or None until the run has a failure rate to act on."""
    m = mtbf(run_seconds, failures)
    if m is None:
        return None
    t = max(daly_interval(save_cost_s, m), 1e-3)
    return IntervalAdvice(save_cost_s=save_cost_s, mtbf_s=m, restart_s=restart_s, failures=failures,
                          current_s=current_s, advised_s=t,
                          goodput_now=expected_goodput(current_s, save_cost_s, m, restart_s) if current_s else None,
                          goodput_advised=expected_goodput(t, save_cost_s, m, restart_s))


def _human(s: float | None) -> str:
    if s is None:
        return "?"
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"
