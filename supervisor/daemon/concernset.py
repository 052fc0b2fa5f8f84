"""The runner's concerns taken together: started in order, every hook called on each, one that
fails reported while the others go on, and what they add to the job's env, status and snapshots."""

from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping, Sequence

import structlog

from ..core.messages import EndAttempt, Resume
from ..core.runend import EndFacts
from ..events import AttemptContext, Monitor
from ..core.observations import MetricRecord
from .ports import Concern, DaemonView

log = structlog.get_logger("supervisor.daemon.runner")


class ConcernSet:
    def __init__(self, concerns: Sequence[Concern]) -> None:
        self.items = list(concerns)

    def __iter__(self) -> Iterator[Concern]:
        return iter(self.items)

    def start(self, daemon: DaemonView) -> None:
        """Start each in order. One that raises: the exception goes on, and only the ones already
        started are kept (they alone are closed)."""
        started: list[Concern] = []
        try:
            for c in self.items:
                c.start(daemon)
                started.append(c)
        finally:
            self.items = started

    def _guarded(self, hook: str, call: Callable[[Concern], object]) -> None:
        """``call`` on every concern; one that fails is reported (naming ``hook``) and the others go on."""
        for c in self.items:
            try:
                call(c)
            except Exception as e:
                log.exception("concern_failed", concern=c.name, hook=hook, error=repr(e),
                              message=f"{c.name} failed in {hook}; the daemon keeps going")

    # One method per hook, each calling the concern's own: a checker sees every call.
    def before_spawn(self, attempt: int, resume: Resume) -> None:
        self._guarded("before_spawn", lambda c: c.before_spawn(attempt, resume))

    def attempt_started(self, ctx: AttemptContext, resume: Resume, wall: float) -> None:
        self._guarded("attempt_started", lambda c: c.attempt_started(ctx, resume, wall))

    def on_metrics(self, batch: Sequence[MetricRecord], now: float) -> None:
        self._guarded("on_metrics", lambda c: c.on_metrics(batch, now))

    def job_hung(self, attempt: int, pids: Sequence[int]) -> None:
        self._guarded("job_hung", lambda c: c.job_hung(attempt, pids))

    def attempt_ended(self, end: EndAttempt, resume: Resume, wall: float) -> None:
        self._guarded("attempt_ended", lambda c: c.attempt_ended(end, resume, wall))

    def tick(self, now: float) -> None:
        self._guarded("tick", lambda c: c.tick(now))

    def on_event(self, event: str, level: str, message: str, data: Mapping[str, Any]) -> None:
        self._guarded("on_event", lambda c: c.on_event(event, level, message, data))

    def close(self) -> None:
        self._guarded("close", lambda c: c.close())

    def end_facts(self, keepalive: Callable[[], bool]) -> EndFacts:
        """Each concern's part of the end; one that fails leaves its part as "not looked at"."""
        facts = EndFacts()
        for c in self.items:
            try:
                facts = c.end_facts(facts, keepalive)
            except Exception as e:
                log.exception("concern_failed", concern=c.name, hook="end_facts", error=repr(e),
                              message=f"{c.name} failed in end_facts; the end is said without its part")
        return facts

    def job_env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for c in self.items:
            env.update(c.job_env())
        return env

    def monitors(self) -> list[Monitor]:
        return [m for c in self.items for m in c.monitors()]

    def snapshots(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for c in self.items:
            out.update(c.snapshot())
        return out

    def statuses(self) -> list[Any]:
        return [c.status() for c in self.items]

    def live_statuses(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for c in self.items:
            try:
                out.update(c.live_status())
            except Exception as e:  # a status part failing leaves the cached snapshot as it is
                log.warning("concern_failed", concern=c.name, hook="live_status", error=repr(e),
                            message=f"{c.name} failed in live_status; status answers with the cached snapshot")
        return out
