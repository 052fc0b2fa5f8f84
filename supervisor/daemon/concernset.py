"""The runner's concerns taken together: started in order, every hook called on each, one that
fails reported while the others go on, and what they add to the job's env, status and snapshots."""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import structlog

from ..events import Monitor
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

    def each(self, hook: str, *args: Any) -> None:
        """Call ``hook`` on every concern; one that fails is reported and the others go on."""
        for c in self.items:
            try:
                getattr(c, hook)(*args)
            except Exception as e:
                log.exception("concern_failed", concern=c.name, hook=hook, error=repr(e),
                              message=f"{c.name} failed in {hook}; the daemon keeps going")

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
                log.warning("concern_live_status_failed", concern=c.name, error=repr(e))
        return out
