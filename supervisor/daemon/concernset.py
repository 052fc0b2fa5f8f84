"""The runner's plug-ins taken together: started in order, every notice given to each that reacts
to it, one that fails reported while the others go on; the effects a reaction returns carried out
by the runner, in order; and what they add to the job's env, status and snapshots."""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import structlog

from ..core.runend import EndFacts
from ..events import Monitor
from .effects import Effect
from .plugin import (AttemptEnded, AttemptSpawning, AttemptStarted, Closes, DaemonStarted, GivesEndFacts, GivesJobEnv,
                     GivesLiveStatus, GivesMonitors, GivesStatus, JobHung, MetricsBatch, Noted, Notice, OnNotes, Plugin,
                     RunView, Tick, reaction)

log = structlog.get_logger("supervisor.daemon.runner")


class ConcernSet:
    """``view``: the turn's :class:`RunView`; ``apply``: carries out one effect (the runner's)."""

    def __init__(self, concerns: Sequence[Plugin], view: Callable[[], RunView] | None = None,
                 apply: Callable[[Effect], None] = lambda e: None) -> None:
        self.items = list(concerns)
        self.view = view
        self.apply = apply

    def __iter__(self) -> Iterator[Plugin]:
        return iter(self.items)

    def _run(self) -> RunView:
        assert self.view is not None, "a plug-in was asked before the set had the runner's view"
        return self.view()

    def start(self, notice: DaemonStarted) -> None:
        """Start each in order. One that raises: the exception goes on, and only the ones already
        started are kept (they alone are closed)."""
        started: list[Plugin] = []
        try:
            for c in self.items:
                if (react := reaction(c, notice)) is not None:
                    for e in react(self._run()):
                        self.apply(e)
                started.append(c)
        finally:
            self.items = started

    def _guarded(self, hook: str, notice: Notice) -> None:
        """``notice`` to every plug-in that reacts to it (its effects carried out); one that fails
        is reported (naming ``hook``) and the others go on."""
        for c in self.items:
            try:
                if (react := reaction(c, notice)) is not None:
                    for e in react(self._run()):
                        self.apply(e)
            except Exception as e:
                log.exception("concern_failed", concern=c.name, hook=hook, error=repr(e),
                              message=f"{c.name} failed in {hook}; the daemon keeps going")

    # One method per notice: a checker sees every call.
    def before_spawn(self, n: AttemptSpawning) -> None:
        self._guarded("before_spawn", n)

    def attempt_started(self, n: AttemptStarted) -> None:
        self._guarded("attempt_started", n)

    def on_metrics(self, n: MetricsBatch) -> None:
        self._guarded("on_metrics", n)

    def job_hung(self, n: JobHung) -> None:
        self._guarded("job_hung", n)

    def attempt_ended(self, n: AttemptEnded) -> None:
        self._guarded("attempt_ended", n)

    def tick(self, n: Tick) -> None:
        self._guarded("tick", n)

    def on_event(self, n: Noted) -> None:
        """Every recorded event, from the thread that recorded it (no view: see ``Noted``)."""
        for c in self.items:
            try:
                if isinstance(c, OnNotes):
                    for e in c.noted(n):
                        self.apply(e)
            except Exception as e:
                log.exception("concern_failed", concern=c.name, hook="on_event", error=repr(e),
                              message=f"{c.name} failed in on_event; the daemon keeps going")

    def close(self) -> None:
        for c in self.items:
            try:
                for e in (c.close() if isinstance(c, Closes) else None) or ():
                    self.apply(e)
            except Exception as e:
                log.exception("concern_failed", concern=c.name, hook="close", error=repr(e),
                              message=f"{c.name} failed in close; the daemon keeps going")

    def end_facts(self, keepalive: Callable[[], bool]) -> EndFacts:
        """Each concern's part of the end; one that fails leaves its part as "not looked at"."""
        facts = EndFacts()
        for c in self.items:
            try:
                if isinstance(c, GivesEndFacts):
                    facts = c.end_facts(facts, keepalive, self._run())
            except Exception as e:
                log.exception("concern_failed", concern=c.name, hook="end_facts", error=repr(e),
                              message=f"{c.name} failed in end_facts; the end is said without its part")
        return facts

    def job_env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for c in self.items:
            env.update(c.job_env(self._run()) if isinstance(c, GivesJobEnv) else {})
        return env

    def monitors(self) -> list[Monitor]:
        return [m for c in self.items for m in (c.monitors(self._run()) if isinstance(c, GivesMonitors) else ())]

    def snapshots(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for c in self.items:
            if isinstance(c, GivesMonitors):
                out.update(c.snapshot())
        return out

    def statuses(self) -> list[Any]:
        return [c.status(self._run()) for c in self.items if isinstance(c, GivesStatus)]

    def live_statuses(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for c in self.items:
            try:
                out.update(c.live_status() if isinstance(c, GivesLiveStatus) else {})
            except Exception as e:  # a status part failing leaves the cached snapshot as it is
                log.warning("concern_failed", concern=c.name, hook="live_status", error=repr(e),
                            message=f"{c.name} failed in live_status; status answers with the cached snapshot")
        return out
