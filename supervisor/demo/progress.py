"""The demo's narration of progress, a plug-in: a console line every PROGRESS_EVERY steps."""

from __future__ import annotations

from typing import Callable

from ..daemon.plugin import AttemptStarted, Effects, MetricsBatch, OnAttempts, OnMetrics, RunView

PROGRESS_EVERY = 100


class DemoProgress(OnAttempts, OnMetrics):
    """The demo's narration of progress: a line every PROGRESS_EVERY steps."""

    name = "demo_progress"

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say  # the narrator's console line
        self._next = PROGRESS_EVERY
        self._attempt = 0

    def attempt_started(self, n: AttemptStarted, run: RunView) -> Effects:
        self._attempt = n.ctx.attempt
        self._next = ((n.resume.step or 0) // PROGRESS_EVERY + 1) * PROGRESS_EVERY
        return ()

    def metrics(self, n: MetricsBatch, run: RunView) -> Effects:
        for m in n.records:
            if m.step is not None and m.loss is not None and m.step >= self._next:
                self.say(f"   step {m.step:>4}  loss {m.loss:.4f}  (attempt {self._attempt})")
                self._next = (m.step // PROGRESS_EVERY + 1) * PROGRESS_EVERY
            elif m.step is not None and m.step < self._next - PROGRESS_EVERY:
                self._next = (m.step // PROGRESS_EVERY + 1) * PROGRESS_EVERY  # after a rollback
        return ()
