"""``resume_ignored``: after a resume, the job's first step judged against the resume step.

The rule is :func:`supervisor.core.resumecheck.resume_ignored` (pure); this concern feeds it the
first step each resumed attempt reports, says a violation once per attempt (warning: console,
journal, ledger, so ``history --json`` lists it) and keeps it for ``status``. The post-restart
validation names it in its verdict too (:mod:`supervisor.core.validation`).
"""
from __future__ import annotations

from typing import Any, Mapping

from ..core.messages import Resume
from ..core.resumecheck import RULE, resume_ignored
from ..eventnames import EventName
from ..levels import Level
from .effects import Note
from .plugin import AttemptStarted, Effects, GivesStatus, MetricsBatch, OnAttempts, OnMetrics, RunView


class ResumeWatchPlugin(OnAttempts, OnMetrics, GivesStatus):
    name = "resume_watch"

    def __init__(self) -> None:
        self._resume: Resume | None = None  # of the current attempt, until its first step is judged
        self._attempt = -1
        self.last: dict[str, Any] | None = None  # the latest resume_ignored of this daemon's life

    def attempt_started(self, n: AttemptStarted, run: RunView) -> Effects:
        self._attempt = n.ctx.attempt
        # A job handed nothing (no resume flag, and it does not read TSUP_RESUME_FROM: the resume
        # discovery said resume_unavailable) is never blamed for ignoring what it never got.
        resume = n.resume
        self._resume = resume if resume.checkpoint and resume.step is not None and resume.handed else None
        return ()

    def metrics(self, n: MetricsBatch, run: RunView) -> Effects:
        resume = self._resume
        if resume is None:
            return ()
        first = next((r.step for r in n.records if r.step is not None), None)
        if first is None:
            return ()
        self._resume = None  # judged once, on the first step
        ignored = resume_ignored(resume.step, first, resume.checkpoint)
        if ignored is None:
            return ()
        self.last = {**ignored.to_json(), "attempt": self._attempt}
        return [Note(EventName.RESUME_IGNORED, Level.WARNING,
                     f"{ignored.message} (rule: {RULE}). The job keeps running from step {first}; a restart would "
                     "not help. Fix: pass the checkpoint the way the script reads it, e.g. "
                     "--resume-arg=--resume={checkpoint} / [job] resume_args, or read TSUP_RESUME_FROM",
                     ignored.to_json())]  # the event carries the attempt itself

    def status(self, run: RunView) -> Mapping[str, Any]:
        return {"resume_ignored": self.last}
