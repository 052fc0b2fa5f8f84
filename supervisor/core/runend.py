"""The end of a run that the job itself ended with exit 0: what was watched, and the verdict.

A job's exit 0 says the job is done, not that it trained well. Before the daemon says
"finished" it gathers :class:`EndFacts` (the runner asks each concern: the metric sources the
log watcher saw, the finite check of the newest checkpoint) and :func:`end_verdict` turns them
into the words and the exit code:

- ``watched``: at least one metric source yielded a record; exit 0. Lines that started like metric
  records but gave none (``{"loss": tensor(nan)}``) are counted per source and said in the words
  ("NOT fully watched: N lines of stdout ..."): the end never reads as full assurance over them.
- ``unwatched``: no training metric was ever seen (NaN, spikes and progress went unwatched);
  "finished, unwatched", the job's exit 0 unchanged.
- ``nonfinite_weights``: the newest checkpoint holds NaN/Inf tensors; "finished with non-finite
  weights in <checkpoint>", ended as a give-up (exit 3: a fault that needs a human, SPEC), since
  anything resumed or deployed from it carries the NaN, and a relaunch would only run the
  finished job again.

Every sentence says what was checked; a check that did not happen is said as not done, and why.
Pure: the facts arrive in the :class:`~supervisor.core.messages.EndChecked` event.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

#: Sources and tensor names said in the message (the data keeps what a tool reads).
SAID = 5


class Verdict(StrEnum):
    WATCHED = "watched"
    UNWATCHED = "unwatched"
    NONFINITE_WEIGHTS = "nonfinite_weights"


@dataclass(frozen=True)
class SourceSeen:
    """One metric source of the run (``stdout``, ``file:<path>``, ``tb:<path>``, ...), as the log
    watcher's book has it: :class:`supervisor.watch.sources.SourceBook`, the one list every
    metric source feeds."""

    source: str
    formats: tuple[str, ...]
    records: int
    last_step: int | None
    at_wall: float  # unix time of its last record
    unread: int = 0  # lines that started like a metric record but gave none (NaN there went unjudged)

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "formats": list(self.formats), "records": self.records,
                "unread": self.unread, "last_step": self.last_step, "at": round(self.at_wall, 3)}


@dataclass(frozen=True)
class WeightsCheck:
    """The finite check of the newest checkpoint at the end (the check a rollback target gets).
    ``finite`` None: not checked, ``note`` says why (no checkpoint, the load test failed, ...)."""

    checkpoint: str | None
    finite: bool | None
    nonfinite: tuple[str, ...] = ()  # tensor names (the load test names at most 20)
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint, "finite": self.finite, "nonfinite": list(self.nonfinite),
                "note": self.note or None}


@dataclass(frozen=True)
class EndFacts:
    """What the concerns found at the end (each fills its part; the defaults say "not looked at")."""

    sources: tuple[SourceSeen, ...] = ()
    weights: WeightsCheck = WeightsCheck(None, None, note="no checkpoint dir known: no weights checked")
    # Auto-discovered metric files whose non-finite values were not acted on (the job was not shown
    # to write them: metric_file_untrusted), each with the step of the first one.
    withheld: tuple[tuple[str, int | None], ...] = ()


@dataclass(frozen=True)
class EndVerdict:
    verdict: Verdict
    gave_up: bool  # end as a give-up (exit 3)
    reason: str  # the run's reason: console, status, history, journal
    watched: str  # what was watched, one sentence (said in every end)
    unwatched: str | None = None  # run_unwatched's message, when nothing was seen
    nonfinite: str | None = None  # checkpoint_nonfinite_at_end's message, when the weights are NaN/Inf

    def to_json(self, facts: EndFacts) -> dict[str, Any]:
        """``status``'s ``end`` and the events' data."""
        last = _last_step(facts)
        return {"verdict": self.verdict.value, "reason": self.reason, "watched": self.watched,
                "sources": [s.to_json() for s in facts.sources],
                "last_step": last.last_step if last else None, "last_step_at": round(last.at_wall, 3) if last else None,
                "weights": facts.weights.to_json(),
                "withheld": [{"path": p, "step": st} for p, st in facts.withheld]}


def _last_step(facts: EndFacts) -> SourceSeen | None:
    stepped = [s for s in facts.sources if s.last_step is not None]
    return max(stepped, key=lambda s: s.at_wall) if stepped else None


def watched_sources(facts: EndFacts) -> tuple[SourceSeen, ...]:
    """The sources that yielded a record (one with unread lines only was seen, not watched)."""
    return tuple(s for s in facts.sources if s.records)


def _source_text(s: SourceSeen) -> str:
    said = [*s.formats, f"{s.records} record{'s' if s.records != 1 else ''}"]
    if s.unread:
        said.append(f"{s.unread} line{'s' if s.unread != 1 else ''} unread")
    return f"{s.source} ({', '.join(said)})"


def unread_text(facts: EndFacts) -> str:
    """What was not read of what looked like metrics (empty when nothing): the end never reads as
    full assurance over lines no reader could read."""
    unread = [s for s in facts.sources if s.unread]
    if not unread:
        return ""
    n = sum(s.unread for s in unread)
    where = ", ".join(s.source for s in unread[:SAID]) + (f" and {len(unread) - SAID} more" if len(unread) > SAID
                                                          else "")
    return (f"; NOT fully watched: {n} line{'s' if n != 1 else ''} of {where} started like metric records but "
            "gave none, so a NaN or spike in them was not judged (metric_lines_unread says why)")


def withheld_text(facts: EndFacts) -> str:
    """The non-finite values seen in files the job was not shown to write and so not acted on
    (empty when none): a clean end never reads as assurance over a NaN it saw and set aside."""
    if not facts.withheld:
        return ""
    where = ", ".join(f"{p} (step {s})" if s is not None else p for p, s in facts.withheld[:SAID])
    more = f" and {len(facts.withheld) - SAID} more" if len(facts.withheld) > SAID else ""
    return (f"; NOT acted on: a non-finite value in {where}{more}, a file the job was not shown to write "
            "(metric_file_untrusted says why; name it in [job] watch_files if the job writes it)")


def watched_text(facts: EndFacts, wall: float) -> str:
    """``watched: stdout (hf, 120 records), tb:/x (tensorboard, 12 records); last step 1000, 3.2 s
    before the end``, or what it means that nothing was seen; and the lines that started like metric
    records but gave none, when there were any (:func:`unread_text`)."""
    if not watched_sources(facts):
        return ("watched: no metric source yielded a training step or metric in this daemon's life (NaN, loss "
                f"spikes and step progress were NOT watched){unread_text(facts)}{withheld_text(facts)}")
    parts = [_source_text(s) for s in facts.sources[:SAID]]
    more = f" and {len(facts.sources) - SAID} more" if len(facts.sources) > SAID else ""
    last = _last_step(facts)
    step = (f"; last step {last.last_step}, {max(0.0, wall - last.at_wall):.1f} s before the end" if last
            else "; no record named a step")
    return f"watched: {', '.join(parts)}{more}{step}{unread_text(facts)}{withheld_text(facts)}"


def weights_text(w: WeightsCheck) -> str:
    if w.finite is None:
        return f"weights not checked: {w.note}"
    if w.finite:
        return f"weights finite: every tensor of the newest checkpoint {w.checkpoint} checked"
    names = ", ".join(w.nonfinite[:SAID]) + (", ..." if len(w.nonfinite) > SAID else "")
    return f"{len(w.nonfinite)}{'+' if len(w.nonfinite) >= 20 else ''} tensor(s) hold NaN/Inf ({names})"


def end_verdict(facts: EndFacts, *, attempt: int, ran_s: float, wall: float) -> EndVerdict:
    """The verdict on a job that exited 0 with no failure seen."""
    watched = watched_text(facts, wall)
    ran = f"the job exited 0 after {ran_s:.1f} s (attempt {attempt})"
    weights = weights_text(facts.weights)
    unwatched = (f"finished, unwatched: {ran}, but no training metric was ever seen; {watched}"
                 if not watched_sources(facts) else None)
    if facts.weights.finite is False:
        nan = f"finished with non-finite weights in {facts.weights.checkpoint}: {weights}"
        reason = (f"{nan}; {'finished, unwatched; ' if unwatched else ''}{ran}; {watched}. Nothing resumed or "
                  "deployed from it would be sound: a human must look")
        return EndVerdict(Verdict.NONFINITE_WEIGHTS, True, reason, watched, unwatched,
                          f"{nan}; the run ends as a give-up (exit 3): a human must look")
    if unwatched:
        return EndVerdict(Verdict.UNWATCHED, False, f"{unwatched}; {weights}", watched, unwatched)
    return EndVerdict(Verdict.WATCHED, False, f"finished: {ran}; {watched}; {weights}", watched)
