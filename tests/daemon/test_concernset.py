"""The runner's plug-ins taken together (ConcernSet, supervisor/daemon/plugin.py) and the attempt's monitors
(supervisor/daemon/monitors.py): one typed method per notice, each giving it to every plug-in that
reacts to it; one that raises is reported and the others still get it."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

import pytest
from structlog.testing import capture_logs

from supervisor.core.causes import Action, Cause
from supervisor.core.messages import EndAttempt, Resume
from supervisor.daemon.monitors import AttemptMonitors
from supervisor.core.runend import EndFacts
from supervisor.daemon.plugin import ConcernSet, Effects
from supervisor.daemon.plugin import (AttemptEnded, AttemptSpawning, AttemptStarted, Closes, DaemonStarted, GivesEndFacts,
                                      JobHung, MetricsBatch, Noted, OnAttempts, OnMetrics, OnNotes, OnStart, OnTicks,
                                      RunView, Tick)
from supervisor.levels import Level
from supervisor.events import AttemptContext, Emit
from supervisor.core.observations import MetricRecord

RESUME = Resume(None, None, "fresh")
CTX = AttemptContext("run-1", 1, 4000, 4000, 0.0, Path("/state"), Path("/state/hb"), None, None, None)
END = EndAttempt(1, Cause.CRASH, Action.RESTART, "exit 1", True)
BATCH = [MetricRecord(step=1, loss=2.0, at=0.0)]


class Recording(OnStart, OnAttempts, OnMetrics, OnTicks, OnNotes, Closes, GivesEndFacts):
    """A plug-in of every capability that records each notice it gets; ``fails``: raises in every
    reaction instead."""

    def __init__(self, name: str, fails: bool = False) -> None:
        self.name, self.fails = name, fails
        self.seen: list[tuple[str, object]] = []

    def _saw(self, hook: str, notice: object) -> Effects:
        if self.fails:
            raise RuntimeError(f"{self.name} broke in {hook}")
        self.seen.append((hook, notice))
        return ()

    def started(self, n: DaemonStarted, run: RunView) -> Effects:
        return self._saw("start", n)

    def attempt_spawning(self, n: AttemptSpawning, run: RunView) -> Effects:
        return self._saw("before_spawn", n)

    def attempt_started(self, n: AttemptStarted, run: RunView) -> Effects:
        return self._saw("attempt_started", n)

    def metrics(self, n: MetricsBatch, run: RunView) -> Effects:
        return self._saw("on_metrics", n)

    def job_hung(self, n: JobHung, run: RunView) -> Effects:
        return self._saw("job_hung", n)

    def attempt_ended(self, n: AttemptEnded, run: RunView) -> Effects:
        return self._saw("attempt_ended", n)

    def tick(self, n: Tick, run: RunView) -> Effects:
        return self._saw("tick", n)

    def noted(self, n: Noted) -> Effects:
        return self._saw("on_event", n)

    def close(self) -> Effects:
        return self._saw("close", None)

    def end_facts(self, facts: EndFacts, keepalive: Callable[[], bool], run: RunView) -> EndFacts:
        return facts


NOTED = Noted("x_happened", Level.INFO, "x", {"k": 1}, "run-1", 1, 0.0, 0.0)
SPAWNING, STARTED, METRICS = AttemptSpawning(1, RESUME), AttemptStarted(CTX, RESUME, 5.0, ()), MetricsBatch(BATCH, 7.0)
HUNG, ENDED, TICK = JobHung(1, [4000, 4001]), AttemptEnded(END, RESUME, 9.0), Tick(3.0)
HOOKS: dict[str, tuple[Callable[[ConcernSet], None], object]] = {
    "before_spawn": (lambda s: s.before_spawn(SPAWNING), SPAWNING),
    "attempt_started": (lambda s: s.attempt_started(STARTED), STARTED),
    "on_metrics": (lambda s: s.on_metrics(METRICS), METRICS),
    "job_hung": (lambda s: s.job_hung(HUNG), HUNG),
    "attempt_ended": (lambda s: s.attempt_ended(ENDED), ENDED),
    "tick": (lambda s: s.tick(TICK), TICK),
    "on_event": (lambda s: s.on_event(NOTED), NOTED),
    "close": (lambda s: s.close(), None),
}


def _set(plugins: list[Recording]) -> ConcernSet:
    return ConcernSet(plugins, view=lambda: None)  # type: ignore[arg-type,return-value]  # no plug-in here reads it


@pytest.mark.parametrize("hook", sorted(HOOKS))
def test_a_concern_failing_in_a_hook_is_reported_and_the_others_still_get_it(hook: str) -> None:
    call, notice = HOOKS[hook]
    first, broken, last = Recording("first"), Recording("broken", fails=True), Recording("last")
    concerns = _set([first, broken, last])
    with capture_logs() as logs:
        call(concerns)
    assert first.seen == [(hook, notice)] and last.seen == [(hook, notice)]
    (failed,) = [e for e in logs if e["event"] == "concern_failed"]
    assert failed["concern"] == "broken" and failed["hook"] == hook
    assert "broken broke in " + hook in failed["error"] and "the daemon keeps going" in failed["message"]


def test_every_notice_has_its_typed_method_on_the_set() -> None:
    """A notice added to the contract and not to the set would never be given."""
    from typing import get_args

    from supervisor.daemon.plugin import Notice

    notices = {t.__name__ for t in get_args(Notice)} - {"DaemonStarted"}  # given by start()
    told = {type(n).__name__ for _call, n in HOOKS.values() if n is not None} - {"Noted"}
    assert told == notices
    assert all(callable(getattr(ConcernSet, h, None)) for h in set(HOOKS) | {"end_facts", "start"})


def test_the_ends_facts_are_each_concerns_part_and_one_that_fails_leaves_its_part_unsaid() -> None:
    from dataclasses import replace

    from supervisor.core.runend import SourceSeen, WeightsCheck

    class Sees(Recording):
        def end_facts(self, facts: EndFacts, keepalive: Callable[[], bool], run: RunView) -> EndFacts:
            keepalive()
            return replace(facts, sources=(SourceSeen("stdout", ("kv",), 3, 9, 1.0),))

    class Breaks(Recording):
        def end_facts(self, facts: EndFacts, keepalive: Callable[[], bool], run: RunView) -> EndFacts:
            raise RuntimeError("no disk")

    pinged: list[int] = []

    def ping() -> bool:
        pinged.append(1)
        return True
    with capture_logs() as logs:
        facts = _set([Sees("watch"), Breaks("checkpoints")]).end_facts(ping)
    assert [s.source for s in facts.sources] == ["stdout"] and pinged == [1]
    assert facts.weights == WeightsCheck(None, None, note="no checkpoint dir known: no weights checked")
    (failed,) = [e for e in logs if e["event"] == "concern_failed"]
    assert failed["concern"] == "checkpoints" and failed["hook"] == "end_facts"


def test_a_concern_failing_to_start_leaves_only_the_started_ones_to_close() -> None:
    class FailsToStart(Recording):
        def started(self, n: DaemonStarted, run: RunView) -> Effects:
            raise RuntimeError("no socket")

    first, second, third = Recording("first"), FailsToStart("second"), Recording("third")
    concerns = _set([first, second, third])
    started = DaemonStarted(None, dict)  # type: ignore[arg-type]  # no plug-in here reads them
    with pytest.raises(RuntimeError, match="no socket"):
        concerns.start(started)
    concerns.close()
    assert [c.name for c in concerns] == ["first"] and first.seen == [("start", started), ("close", None)]
    assert third.seen == []


class Mon:
    def __init__(self, name: str, fails_in: str = "") -> None:
        self.name, self.fails_in = name, fails_in
        self.calls: list[str] = []

    def _call(self, method: str) -> None:
        self.calls.append(method)
        if method == self.fails_in:
            raise OSError(f"{self.name}: {method} failed")

    def start(self, ctx: AttemptContext, emit: Emit) -> None:
        self._call("start")

    def poll(self, now: float) -> None:
        self._call("poll")

    def stop(self) -> None:
        self._call("stop")

    def status(self) -> Mapping[str, object]:
        return {}


def test_a_monitor_that_fails_is_reported_once_disabled_for_the_attempt_and_still_stopped() -> None:
    reports: list[tuple[str, str, str, dict[str, Any]]] = []
    mons = AttemptMonitors(lambda ev, lvl, msg, **data: reports.append((ev, lvl, msg, data)))
    good, bad = Mon("good"), Mon("bad", fails_in="poll")
    mons.start([good, bad], CTX, lambda d: None)
    mons.poll(1.0)
    mons.poll(2.0)  # the bad one is not polled again
    mons.stop()
    assert good.calls == ["start", "poll", "poll", "stop"] and bad.calls == ["start", "poll", "stop"]
    (r,) = reports
    assert r[0] == "monitor_failed" and r[3] == {"monitor": "bad"}
    assert "monitor bad failed in poll" in r[2] and "the job keeps running" in r[2]
    mons.start([bad], CTX, lambda d: None)  # a new attempt: polled again
    mons.poll(3.0)
    assert bad.calls[-2:] == ["start", "poll"] and len(reports) == 2
