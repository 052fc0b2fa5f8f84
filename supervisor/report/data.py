"""What the run report shows, as data: the ledger's attempts and the metric series
(:class:`ReportData`), the restart and rollback markers worked out from them, and the client's
metric files read back. Drawn by :mod:`.plot`, written by :mod:`.page`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

from ..checkpoints.layouts.names import name_step

class MetricPoint(NamedTuple):
    """One loss observation: wall-clock time (epoch seconds), step, loss, attempt number."""

    wall_time: float
    step: int
    loss: float
    attempt: int


@dataclass(frozen=True)
class ReportData:
    """Everything the report shows; built by the runner / ``report`` command from the ledger.

    ``attempts`` follow the SPEC's ``history --json`` shape (``attempt``, ``started_at``,
    ``ended_at``, ``exit_code``, ``signal``, ``cause``, ``action``, ``checkpoint``, ``remedies``,
    ``validation``; an optional ``resume_step`` wins over the step read from the checkpoint).
    ``checkpoints`` are ``checkpoints --json`` rows. ``goodput``: ``productive_s``, ``lost_s``
    (a number, or a mapping cause -> seconds), ``ratio``. ``interval``: the checkpoint interval
    advice (``status``'s ``checkpoint_interval``: ``advised_s``, ``current_s``, ``goodput_now``,
    ``goodput_advised``, ``save_cost_s``, ``mtbf_s``, ``failures``, ``summary``). ``summary``: free
    key/value facts shown at the top (e.g. final loss, fault-free reference loss).
    """

    run_id: str
    metrics: Sequence[tuple[float, int, float, int]] = ()
    attempts: Sequence[Mapping[str, Any]] = ()
    events: Sequence[Mapping[str, Any]] = ()
    checkpoints: Sequence[Mapping[str, Any]] = ()
    goodput: Mapping[str, Any] | None = None
    summary: Mapping[str, Any] = field(default_factory=dict)
    title: str = "transformer-supervisor run report"
    interval: Mapping[str, Any] | None = None  # the checkpoint interval advice (IntervalAdvice.to_json)

    @classmethod
    def from_history(
        cls,
        history: Mapping[str, Any],
        metrics: Iterable[tuple[float, int, float, int]],
        checkpoints: Sequence[Mapping[str, Any]] = (),
        goodput: Mapping[str, Any] | None = None,
        summary: Mapping[str, Any] | None = None,
        interval: Mapping[str, Any] | None = None,
    ) -> ReportData:
        """From a ``history --json`` document plus the metric series."""
        return cls(
            run_id=str(history.get("run_id", "")),
            metrics=tuple(metrics),
            attempts=tuple(history.get("attempts", ())),
            events=tuple(history.get("events", ())),
            checkpoints=tuple(checkpoints),
            goodput=goodput,
            summary=dict(summary or {}),
            interval=interval,
        )


@dataclass(frozen=True)
class Marker:
    """A restart of attempt ``attempt``: when, why the attempt before it ended, where it resumed."""

    attempt: int
    wall_time: float | None  # epoch seconds of the attempt's start
    cause: str  # cause of the previous attempt
    action: str  # what the supervisor did about it
    resume_step: int | None  # the step the run went back to (None: from scratch)
    previous_last_step: int | None  # the last step the previous attempt reached

    @property
    def is_rollback(self) -> bool:
        """The supervisor went back before the anomaly on purpose (action ``rollback``: a NaN, a
        loss spike); a restart resumes from the newest good checkpoint, whatever it redoes."""
        return self.action == "rollback"

    @property
    def steps_redone(self) -> int:
        """Steps trained again: from the resume step up to the last step the attempt before reached."""
        if self.resume_step is None or self.previous_last_step is None:
            return 0
        return max(0, self.previous_last_step - self.resume_step)

    @property
    def label(self) -> str:
        where = f"step {self.resume_step}" if self.resume_step is not None else "scratch"
        return f"restart {self.attempt} after {self.cause}: {self.action} to {where}"




def epoch_seconds(value: Any) -> float | None:
    """ISO-8601 text (naive = UTC) or epoch seconds -> epoch seconds."""
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        dt = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def metric_points(data: ReportData) -> list[MetricPoint]:
    pts = [MetricPoint(float(t), int(s), float(l), int(a)) for t, s, l, a in data.metrics]
    return sorted(pts, key=lambda p: (p.wall_time, p.attempt, p.step))


def _checkpoint_step(path: str | None, checkpoints: Sequence[Mapping[str, Any]]) -> int | None:
    if not path:
        return None
    for row in checkpoints:
        if row.get("path") == path and row.get("step") is not None:
            return int(row["step"])
    return name_step(Path(path).name).step  # never the last number of several (step_1000_v2.pt)


def restart_markers(data: ReportData) -> list[Marker]:
    """One marker per attempt after the first, oldest first."""
    attempts = sorted(data.attempts, key=lambda a: int(a.get("attempt", 0)))
    points = metric_points(data)
    last_step: dict[int, int] = {}
    for p in points:
        last_step[p.attempt] = max(last_step.get(p.attempt, p.step), p.step)
    markers: list[Marker] = []
    for prev, cur in zip(attempts, attempts[1:]):
        n = int(cur.get("attempt", 0))
        resume = cur.get("resume_step")
        if resume is None:
            resume = _checkpoint_step(cur.get("checkpoint"), data.checkpoints)
        if resume is None and not cur.get("checkpoint"):
            resume = 0  # relaunched without a checkpoint: back to the start
        markers.append(
            Marker(
                attempt=n,
                wall_time=epoch_seconds(cur.get("started_at")),
                cause=str(prev.get("cause") or "unknown"),
                action=str(prev.get("action") or "restart"),
                resume_step=int(resume) if resume is not None else None,
                previous_last_step=last_step.get(int(prev.get("attempt", 0))),
            )
        )
    return markers


def load_client_metrics(paths: Iterable[str | Path]) -> list[tuple[float, int, float, int]]:
    """``(wall_time, step, loss, attempt)`` from the client's ``metrics-rank*.jsonl`` files.

    The client appends one JSON object per ``report()`` with ``t``, ``step``, ``loss`` and
    ``attempt``; records without a step or a loss, and unreadable lines (a torn last line of a
    killed job), are skipped. NaN/Infinity losses are kept: the plot marks them.
    """
    out: list[tuple[float, int, float, int]] = []
    for path in paths:
        try:
            lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                rec = json.loads(line)
                out.append((float(rec["t"]), int(rec["step"]), float(rec["loss"]), int(rec.get("attempt", 0))))
            except (ValueError, KeyError, TypeError):
                continue
    return sorted(out)
