"""The inputs of the checkpoint interval advice, read from the ledger and the checkpoint dir.

The math is pure (core/interval.py); this gathers what the run measured: the failure rate and the
relaunch cost across every run in the state dir, the save cost from the job's step rhythm around
its saves (the checkpoints' mtimes in the folder: when each save ended), and the interval it
saves at now. Cheap enough for a ``status`` request: one indexed query of the newest 5 000 step
times, one scan of the folder (no lock, no hashing, no load test).
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Protocol

from ..core.interval import IntervalAdvice, advise, save_cost_from_rhythm
from .discovery import Discovery


class FailureLedger(Protocol):
    """What the advice reads of the ledger (ledger/store.py has the SQL)."""

    def failure_record(self) -> tuple[float, int, list[float]]: ...

    def recent_step_times(self, run_id: str, limit: int = 5000) -> list[float]: ...


def interval_advice(ledger: FailureLedger, run_id: str, checkpoint_dir: Path | None) -> IntervalAdvice | None:
    """The advice for this run, or None until there is a failure, a save and a step rhythm."""
    ran, failures, restarts = ledger.failure_record()
    if failures == 0 or checkpoint_dir is None or not checkpoint_dir.is_dir():
        return None
    steps = ledger.recent_step_times(run_id)
    if len(steps) < 5:
        return None
    saves = sorted(c.mtime for c in Discovery(checkpoint_dir, settle_s=0.0).scan()
                   if steps[0] <= c.mtime <= steps[-1])
    cost = save_cost_from_rhythm(steps, saves)
    if cost is None:
        return None
    gaps = [b - a for a, b in zip(saves, saves[1:])]
    current = max(statistics.median(gaps) - cost, 1e-3) if gaps else None  # seconds of work between saves
    return advise(save_cost_s=cost, run_seconds=ran, failures=failures,
                  restart_s=statistics.median(restarts) if restarts else 0.0, current_s=current)
