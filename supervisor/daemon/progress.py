"""Each attempt's progress as plug-ins: goodput (its tracks, rebuilt from the ledger after a
daemon restart, and the checkpoint interval advice) and post-reboot validation (the first steps
after every resume against the run before it, :mod:`supervisor.core.validation`; a failure is a
``validation_failed`` detection). Validation reads the earlier attempts' start-up times from the
tracks goodput keeps: one dict, handed to both by the wiring (data, not a plug-in)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import structlog

from ..core.causes import Cause
from ..core.goodput import Track, goodput_of, tracks_from_rows
from ..core.observations import Detection
from ..eventnames import EventName
from ..levels import Level
from .effects import AttemptField, Detect, Effect, Note
from .plugin import (AttemptEnded, AttemptStarted, DaemonStarted, Effects, GivesStatus, HistoryReader, MetricsBatch,
                     OnAttempts, OnMetrics, OnStart, OnTicks, RunView, Tick)

if TYPE_CHECKING:
    from ..core.validation import Validator, Verdict

log = structlog.get_logger("supervisor.daemon")

GOODPUT_EVERY_S = 5.0
INTERVAL_EVERY_S = 60.0


def startups(tracks: Mapping[int, Track], but: int) -> list[float]:
    """Launch -> first step of every attempt except ``but``."""
    return [s for a, t in tracks.items() if a != but and (s := t.startup()) is not None]


class GoodputPlugin(OnStart, OnAttempts, OnMetrics, GivesStatus):
    """Each attempt's progress, for goodput (rebuilt from the ledger after a daemon restart)."""

    name = "goodput"

    def __init__(self, tracks: dict[int, Track] | None = None) -> None:
        self.tracks: dict[int, Track] = {} if tracks is None else tracks
        self.history: HistoryReader | None = None
        self._cached: dict[str, Any] | None = None
        self._cached_at = float("-inf")
        self._interval: dict[str, Any] | None = None
        self._interval_at = float("-inf")

    def started(self, n: DaemonStarted, run: RunView) -> Effects:
        self.history = n.history
        try:
            self.tracks.update(tracks_from_rows(n.history.attempts(run.run_id), n.history.metrics(run.run_id)))
        except Exception as e:
            log.warning("goodput_history_unreadable", error=repr(e))
        return ()

    def attempt_started(self, n: AttemptStarted, run: RunView) -> Effects:
        self.tracks[n.ctx.attempt] = Track(n.wall, n.resume.step if n.resume.checkpoint else None)
        return ()

    def metrics(self, n: MetricsBatch, run: RunView) -> Effects:
        track = self.tracks.get(run.attempt)
        if track is not None:
            for m in n.records:
                if m.step is not None:
                    track.add(m.at, m.step)
        return ()

    def attempt_ended(self, n: AttemptEnded, run: RunView) -> Effects:
        track = self.tracks.get(n.end.attempt)
        if track is not None:
            track.ended_at = n.wall
            track.cause = n.end.cause.value if n.end.cause else None
        self._cached_at = float("-inf")
        return ()

    def goodput(self, run: RunView) -> dict[str, Any] | None:
        if run.now - self._cached_at < GOODPUT_EVERY_S and self._cached is not None:
            return self._cached
        self._cached_at = run.now
        gp = goodput_of(self.tracks, run.wall)
        self._cached = gp.to_json() if gp is not None else None
        return self._cached

    def status(self, run: RunView) -> Mapping[str, Any]:
        gp = self.goodput(run)
        return {"goodput": gp["ratio"] if gp else None, "goodput_detail": gp,
                "checkpoint_interval": self.interval_advice(run)}

    def interval_advice(self, run: RunView) -> dict[str, Any] | None:
        """The checkpoint interval that maximises goodput for the failure rate measured so far
        (checkpoints/cadence.py), recomputed at most once a minute."""
        # Once a minute; until there is advice (a failure, a save and a step rhythm), every few seconds.
        if run.now - self._interval_at < (INTERVAL_EVERY_S if self._interval is not None else GOODPUT_EVERY_S):
            return self._interval
        self._interval_at = run.now
        if self.history is None:
            return None
        # Imported at the first status, not at start: the checkpoint layouts it reads are not on
        # the first launch's way (issue 25 build 1).
        from ..checkpoints.cadence import interval_advice

        try:
            ckdir = run.cfg.checkpoints.dir
            advice = interval_advice(self.history, run.run_id, Path(ckdir) if ckdir else None)
        except Exception as e:  # advice only: never in the way of a status reply
            log.warning("checkpoint_interval_advice_failed", error=repr(e))
            advice = None
        self._interval = advice.to_json() if advice is not None else None
        return self._interval


class ValidationPlugin(OnAttempts, OnMetrics, OnTicks, GivesStatus):
    """Post-reboot validation of every resumed attempt; ``tracks``: goodput's (start-up times)."""

    name = "validation"

    def __init__(self, tracks: Mapping[int, Track]) -> None:
        self.tracks = tracks
        self.validator: Validator | None = None
        self.last: dict[str, Any] | None = None

    def attempt_started(self, n: AttemptStarted, run: RunView) -> Effects:
        self.validator = None
        vc, resume = run.cfg.validation, n.resume
        # A checkpoint the job is not known to take (only in TSUP_RESUME_FROM; resume_unavailable
        # said so) is no resume to validate: its verdict would blame the job for what it never got.
        if not (resume.checkpoint and resume.handed and vc.enabled):
            return ()
        from ..core.validation import Baseline, Validator

        baseline = Baseline.from_history(list(n.history), resume.step, startups(self.tracks, n.ctx.attempt))
        self.validator = Validator(vc, baseline, resume.step, n.ctx.started_monotonic)
        return [Note(EventName.VALIDATION_STARTED, Level.INFO,
                     f"validating the first {vc.steps} steps after resuming from step {resume.step}"
                     + (f" (reference loss {baseline.loss_at_resume:.4g})" if baseline.loss_at_resume is not None
                        else " (no loss recorded at that step: loss check skipped)"),
                     {"reference_loss": baseline.loss_at_resume, "grad_norm_p99": baseline.grad_norm_p99,
                      "throughput_median": baseline.throughput_median})]

    def metrics(self, n: MetricsBatch, run: RunView) -> Effects:
        return self._verdict(self.validator.feed(n.records, n.now), run) if self.validator is not None else ()

    def tick(self, n: Tick, run: RunView) -> Effects:
        return self._verdict(self.validator.poll(n.now), run) if self.validator is not None and run.has_job else ()

    def _verdict(self, verdict: Verdict | None, run: RunView) -> Effects:
        if verdict is None:
            return ()
        js = verdict.to_json()
        self.last = js
        out: list[Effect] = [AttemptField(run.attempt, validation=js)]
        if verdict.passed:
            return out + [Note(EventName.VALIDATION_PASSED, Level.INFO, f"post-reboot validation {verdict.summary}",
                               {"checks": js["checks"]})]
        from ..core.resumecheck import CHECK_NAME as RESUME_CHECK

        if [c.name for c in verdict.checks] == [RESUME_CHECK]:
            # The job ignored the checkpoint (resume_ignored, said by ResumeWatchPlugin): another
            # relaunch with the same arguments would ignore it again, so the job keeps running.
            return out + [Note(EventName.VALIDATION_FAILED, Level.WARNING, f"post-reboot validation "
                               f"{verdict.summary}; no restart (it would ignore the checkpoint again): the job keeps "
                               "running", {"checks": js["checks"]})]
        seen = self.validator.seen if self.validator else None
        return out + [Note(EventName.VALIDATION_FAILED, Level.WARNING, f"post-reboot validation {verdict.summary}; "
                           "the resumed state is suspect", {"checks": js["checks"]}),
                      Detect(Detection(Cause.VALIDATION_FAILED, f"post-reboot validation {verdict.summary}",
                                       "validation", step=max(seen) if seen else None,
                                       onset_step=verdict.resume_step, details=js, at=run.wall))]

    def attempt_ended(self, n: AttemptEnded, run: RunView) -> Effects:
        out: Effects = ()
        if self.validator is not None and self.validator.verdict is None:
            self.last = self.validator.incomplete()
            out = [AttemptField(n.end.attempt, validation=self.last)]
        self.validator = None
        return out

    def status(self, run: RunView) -> Mapping[str, Any]:
        return {"validation": self.last}
