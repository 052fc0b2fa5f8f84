"""Goodput: the share of wall time spent on training steps that are kept.

Productive time is the time an attempt spent producing steps that survive (not rolled back by a
later resume from an earlier step). Everything else is lost, charged to the cause of the failure
that made it lost: steps thrown away by a rollback or a restart from an older checkpoint, the
downtime between an attempt's end and the next one's first step (shutdown, backoff, relaunch,
checkpoint load), and the first start-up. Meta calls the ratio ETTR, Google calls it goodput.
Pure: built from attempt records and metric timestamps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence


@dataclass(frozen=True)
class AttemptTimeline:
    attempt: int
    started_at: float  # wall seconds
    ended_at: float | None  # None: still running
    cause: str | None  # why it ended (None: success, stop, or still running)
    resume_step: int | None  # the step it started from (None: from scratch)
    points: Sequence[tuple[float, int]] = field(default_factory=tuple)  # (wall time, step)


@dataclass(frozen=True)
class Goodput:
    productive_s: float
    lost_s: float
    total_s: float
    lost_by_cause: dict[str, float]
    kept_steps: int
    lost_steps: int

    @property
    def ratio(self) -> float | None:
        return None if self.total_s <= 0 else self.productive_s / self.total_s

    def to_json(self) -> dict[str, Any]:
        return {"ratio": None if self.ratio is None else round(self.ratio, 4),
                "productive_s": round(self.productive_s, 3), "lost_s": round(self.lost_s, 3),
                "total_s": round(self.total_s, 3),
                "lost_by_cause": {k: round(v, 3) for k, v in sorted(self.lost_by_cause.items())},
                "kept_steps": self.kept_steps, "lost_steps": self.lost_steps}


def compute(attempts: Sequence[AttemptTimeline], now: float) -> Goodput:
    atts = sorted(attempts, key=lambda a: a.attempt)
    if not atts:
        return Goodput(0.0, 0.0, 0.0, {}, 0, 0)
    start = atts[0].started_at
    end = atts[-1].ended_at if atts[-1].ended_at is not None else now
    total = max(0.0, end - start)
    productive = 0.0
    kept_steps = lost_steps = 0
    lost: dict[str, float] = {}
    for i, a in enumerate(atts):
        pts = sorted(a.points, key=lambda p: p[0])
        # Which of this attempt's steps survive: those at or below the step the next attempt
        # resumed from (all of them for the last attempt, or when the next started from scratch
        # after this one made no checkpoint: then none survive).
        nxt = atts[i + 1] if i + 1 < len(atts) else None
        limit: float = float("inf")
        if nxt is not None:
            limit = nxt.resume_step if nxt.resume_step is not None else -1
        kept = [p for p in pts if p[1] <= limit]
        if kept:
            first_t = pts[0][0]
            productive += max(0.0, kept[-1][0] - first_t)
            kept_steps += len({s for _, s in kept})
        lost_steps += len({s for _, s in pts if s > limit})
        # Lost inside this attempt: its start-up (launch -> first step) is charged to whatever
        # caused this attempt (the previous one's cause, or "startup" for the first).
        prev_cause: str = (atts[i - 1].cause or "restart") if i > 0 else "startup"
        a_end = a.ended_at if a.ended_at is not None else now
        if pts:
            lost[prev_cause] = lost.get(prev_cause, 0.0) + max(0.0, pts[0][0] - a.started_at)
            tail_from = kept[-1][0] if kept else pts[0][0]
            own = a.cause or ("running" if a.ended_at is None else "stopped")
            if a.ended_at is not None or nxt is not None:
                lost[own] = lost.get(own, 0.0) + max(0.0, a_end - tail_from)
        else:
            lost[prev_cause] = lost.get(prev_cause, 0.0) + max(0.0, a_end - a.started_at)
        if nxt is not None:  # downtime between this attempt's end and the next launch
            lost[a.cause or "restart"] = lost.get(a.cause or "restart", 0.0) + max(0.0, nxt.started_at - a_end)
    lost.pop("running", None)
    lost_total = max(0.0, total - productive)
    return Goodput(productive, lost_total, total, lost, kept_steps, lost_steps)


class Track:
    """One attempt's progress for goodput: (wall time, step) points. With ``every_s`` > 0, at
    most one point per ``every_s`` plus the latest, so a week-long run costs kilobytes in the
    daemon, not the whole metric stream; the report keeps every point (``every_s`` = 0)."""

    def __init__(self, started_at: float, resume_step: int | None, every_s: float = 5.0) -> None:
        self.started_at = started_at
        self.resume_step = resume_step
        self.every_s = every_s
        self.ended_at: float | None = None
        self.cause: str | None = None
        self._pts: list[tuple[float, int]] = []
        self._last: tuple[float, int] | None = None

    def add(self, t: float, step: int) -> None:
        if not self._pts or t - self._pts[-1][0] >= self.every_s or step < self._pts[-1][1]:
            self._pts.append((t, step))
            self._last = None
        else:
            self._last = (t, step)

    def points(self) -> list[tuple[float, int]]:
        return self._pts + ([self._last] if self._last else [])

    def startup(self) -> float | None:
        """Launch -> first step."""
        return self._pts[0][0] - self.started_at if self._pts else None


def tracks_from_rows(attempts: Sequence[Any], metrics: Iterable[Mapping[str, Any]],
                     every_s: float = 5.0) -> dict[int, Track]:
    """The tracks of a run from its ledger rows (attempts: ``attempt``, ``started_at``,
    ``ended_at``, ``cause``, ``checkpoint``, ``resume_step``; metrics: ``attempt``, ``at``,
    ``step``), in the order the metrics were recorded."""
    tracks: dict[int, Track] = {}
    for a in attempts:
        t = tracks.setdefault(a.attempt, Track(a.started_at, a.resume_step if a.checkpoint else None, every_s))
        t.ended_at, t.cause = a.ended_at, a.cause
    for m in metrics:
        if m["step"] is not None and m["attempt"] in tracks:
            tracks[m["attempt"]].add(m["at"], m["step"])
    return tracks


def goodput_of(tracks: Mapping[int, Track], now: float) -> Goodput | None:
    """Goodput over ``tracks`` (None before the first attempt)."""
    if not tracks:
        return None
    return compute([AttemptTimeline(a, t.started_at, t.ended_at, t.cause, t.resume_step, t.points())
                    for a, t in sorted(tracks.items())], now)
