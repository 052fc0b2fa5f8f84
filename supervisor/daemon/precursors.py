"""Checkpoint before the NaN: the precursor watch (watch/precursor.py) on each attempt's
metrics, and a ``checkpoint-now`` request when it sees a divergence coming, with the reason as
an event (``divergence_precursor``)."""
from __future__ import annotations

from typing import Any, Mapping

from ..eventnames import EventName
from ..levels import Level
from ..watch.precursor import PrecursorWatch
from .effects import Effect, Note, RequestCheckpoint
from .plugin import AttemptStarted, Effects, GivesStatus, MetricsBatch, OnAttempts, OnMetrics, RunView


class PrecursorPlugin(OnAttempts, OnMetrics, GivesStatus):
    name = "precursor"

    def __init__(self) -> None:
        self.watch: PrecursorWatch | None = None
        self.requested = 0

    def attempt_started(self, n: AttemptStarted, run: RunView) -> Effects:
        cfg = run.cfg.detectors.precursor
        if self.watch is None or self.watch.cfg != cfg:  # the first attempt, or a reload changed it
            self.watch = PrecursorWatch(cfg)
        self.watch.reset(n.resume.step if n.resume.checkpoint else None)
        return ()

    def metrics(self, n: MetricsBatch, run: RunView) -> Effects:
        watch = self.watch
        if watch is None or not run.has_job:
            return ()
        out: list[Effect] = []
        for rec in n.records:
            if rec.rank not in (None, 0):
                continue  # one rank's view is enough; the others repeat it
            found = watch.feed(rec)
            if found is None:
                continue
            self.requested += 1
            out += [Note(EventName.DIVERGENCE_PRECURSOR, Level.WARNING,
                         f"a divergence may be coming at step {found.step}: {found.reason}; asking the job for a "
                         "checkpoint now, so that a rollback lands close to it",
                         {"kind": found.kind, "step": found.step, "reason": found.reason}), RequestCheckpoint()]
        return out

    def status(self, run: RunView) -> Mapping[str, Any]:
        return {"precursor_checkpoints": self.requested}
