"""Checkpoint before the NaN: the precursor watch (watch/precursor.py) on each attempt's
metrics, and a ``checkpoint-now`` request when it sees a divergence coming, with the reason as
an event (``divergence_precursor``)."""
from __future__ import annotations

from typing import Sequence

from ..core.messages import Resume
from ..events import AttemptContext
from ..core.observations import MetricRecord
from ..watch.precursor import PrecursorWatch
from .ports import Concern, DaemonView


class PrecursorConcern(Concern):
    name = "precursor"

    def __init__(self) -> None:
        self.daemon: DaemonView | None = None
        self.watch: PrecursorWatch | None = None
        self.requested = 0

    def start(self, daemon: DaemonView) -> None:
        self.daemon = daemon
        self.watch = PrecursorWatch(daemon.cfg.detectors.precursor)

    def attempt_started(self, ctx: AttemptContext, resume: Resume, wall: float) -> None:
        assert self.daemon is not None
        cfg = self.daemon.cfg.detectors.precursor
        if self.watch is None or self.watch.cfg != cfg:  # a reload changed it
            self.watch = PrecursorWatch(cfg)
        self.watch.reset(resume.step if resume.checkpoint else None)

    def on_metrics(self, batch: Sequence[MetricRecord], now: float) -> None:
        d, watch = self.daemon, self.watch
        if d is None or watch is None or not d.has_job:
            return
        for rec in batch:
            if rec.rank not in (None, 0):
                continue  # one rank's view is enough; the others repeat it
            found = watch.feed(rec)
            if found is None:
                continue
            self.requested += 1
            d.event("divergence_precursor", "warning",
                    f"a divergence may be coming at step {found.step}: {found.reason}; asking the job for a "
                    "checkpoint now, so that a rollback lands close to it",
                    kind=found.kind, step=found.step, reason=found.reason)
            d.request_checkpoint()

    def status(self) -> dict[str, int]:
        return {"precursor_checkpoints": self.requested}
