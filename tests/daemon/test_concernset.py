"""The runner's concerns taken together (supervisor/daemon/concernset.py) and the attempt's monitors
(supervisor/daemon/monitors.py): one typed method per hook, each calling every concern's own
method; one that raises is reported and the others still run."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pytest
from structlog.testing import capture_logs

from supervisor.core.causes import Action, Cause
from supervisor.core.messages import EndAttempt, Resume
from supervisor.daemon.concernset import ConcernSet
from supervisor.daemon.monitors import AttemptMonitors
from supervisor.daemon.plugin import (AttemptEnded, AttemptSpawning, AttemptStarted, DaemonStarted, JobHung, MetricsBatch,
                                      Noted, Tick)
from supervisor.levels import Level
from supervisor.daemon.ports import Concern
from supervisor.events import AttemptContext, Emit
from supervisor.core.observations import MetricRecord

RESUME = Resume(None, None, "fresh")
CTX = AttemptContext("run-1", 1, 4000, 4000, 0.0, Path("/state"), Path("/state/hb"), None, None, None)
END = EndAttempt(1, Cause.CRASH, Action.RESTART, "exit 1", True)
BATCH = [MetricRecord(step=1, loss=2.0, at=0.0)]


class Recording(Concern):
    """Records every hook it sees, with its arguments; ``fails``: raises in every hook instead."""

    def __init__(self, name: str, fails: bool = False) -> None:
        self.name, self.fails = name, fails
        self.seen: list[tuple[str, tuple[Any, ...]]] = []

    def _saw(self, hook: str, *args: Any) -> None:
        if self.fails:
            raise RuntimeError(f"{self.name} broke in {hook}")
        self.seen.append((hook, args))

    def before_spawn(self, attempt: int, resume: Resume) -> None:
        self._saw("before_spawn", attempt, resume)

    def attempt_started(self, ctx: AttemptContext, resume: Resume, wall: float) -> None:
        self._saw("attempt_started", ctx, resume, wall)

    def on_metrics(self, batch: Sequence[MetricRecord], now: float) -> None:
        self._saw("on_metrics", batch, now)

    def job_hung(self, attempt: int, pids: Sequence[int]) -> None:
        self._saw("job_hung", attempt, pids)

    def attempt_ended(self, end: EndAttempt, resume: Resume, wall: float) -> None:
        self._saw("attempt_ended", end, resume, wall)

    def tick(self, now: float) -> None:
        self._saw("tick", now)

    def on_event(self, event: str, level: str, message: str, data: Mapping[str, Any]) -> None:
        self._saw("on_event", event, level, message, data)

    def close(self) -> None:
        self._saw("close")


HOOKS: dict[str, tuple[Callable[[ConcernSet], None], tuple[Any, ...]]] = {
    "before_spawn": (lambda s: s.before_spawn(AttemptSpawning(1, RESUME)), (1, RESUME)),
    "attempt_started": (lambda s: s.attempt_started(AttemptStarted(CTX, RESUME, 5.0, ())), (CTX, RESUME, 5.0)),
    "on_metrics": (lambda s: s.on_metrics(MetricsBatch(BATCH, 7.0)), (BATCH, 7.0)),
    "job_hung": (lambda s: s.job_hung(JobHung(1, [4000, 4001])), (1, [4000, 4001])),
    "attempt_ended": (lambda s: s.attempt_ended(AttemptEnded(END, RESUME, 9.0)), (END, RESUME, 9.0)),
    "tick": (lambda s: s.tick(Tick(3.0)), (3.0,)),
    "on_event": (lambda s: s.on_event(Noted("x_happened", Level.INFO, "x", {"k": 1}, "run-1", 1, 0.0, 0.0)),
                 ("x_happened", "info", "x", {"k": 1})),
    "close": (lambda s: s.close(), ()),
}


@pytest.mark.parametrize("hook", sorted(HOOKS))
def test_a_concern_failing_in_a_hook_is_reported_and_the_others_still_get_it(hook: str) -> None:
    call, args = HOOKS[hook]
    first, broken, last = Recording("first"), Recording("broken", fails=True), Recording("last")
    concerns = ConcernSet([first, broken, last])
    with capture_logs() as logs:
        call(concerns)
    assert first.seen == [(hook, args)] and last.seen == [(hook, args)]
    (failed,) = [e for e in logs if e["event"] == "concern_failed"]
    assert failed["concern"] == "broken" and failed["hook"] == hook
    assert "broken broke in " + hook in failed["error"] and "the daemon keeps going" in failed["message"]


def test_every_hook_of_a_concern_has_its_typed_method_on_the_set() -> None:
    """A hook added to Concern and not to the set would never be called."""
    hooks = {n for n, v in vars(Concern).items() if callable(v) and not n.startswith("_")}
    # gathered, not broadcast
    not_dispatched = {"start", "monitors", "job_env", "status", "live_status", "snapshot", "end_facts"}
    assert hooks - not_dispatched == set(HOOKS)
    assert all(callable(getattr(ConcernSet, h, None)) for h in set(HOOKS) | {"end_facts"})


def test_the_ends_facts_are_each_concerns_part_and_one_that_fails_leaves_its_part_unsaid() -> None:
    from dataclasses import replace

    from supervisor.core.runend import EndFacts, SourceSeen, WeightsCheck

    class Sees(Recording):
        def end_facts(self, facts: EndFacts, keepalive: Callable[[], object]) -> EndFacts:
            keepalive()
            return replace(facts, sources=(SourceSeen("stdout", ("kv",), 3, 9, 1.0),))

    class Breaks(Recording):
        def end_facts(self, facts: EndFacts, keepalive: Callable[[], object]) -> EndFacts:
            raise RuntimeError("no disk")

    pinged: list[int] = []

    def ping() -> bool:
        pinged.append(1)
        return True
    with capture_logs() as logs:
        facts = ConcernSet([Sees("watch"), Breaks("checkpoints")]).end_facts(ping)
    assert [s.source for s in facts.sources] == ["stdout"] and pinged == [1]
    assert facts.weights == WeightsCheck(None, None, note="no checkpoint dir known: no weights checked")
    (failed,) = [e for e in logs if e["event"] == "concern_failed"]
    assert failed["concern"] == "checkpoints" and failed["hook"] == "end_facts"


def test_a_concern_failing_to_start_leaves_only_the_started_ones_to_close() -> None:
    class FailsToStart(Recording):
        def start(self, daemon: Any) -> None:
            raise RuntimeError("no socket")

    first, second, third = Recording("first"), FailsToStart("second"), Recording("third")
    concerns = ConcernSet([first, second, third])
    with pytest.raises(RuntimeError, match="no socket"):
        concerns.start(None, DaemonStarted(None, dict))  # type: ignore[arg-type]  # no concern here reads them
    concerns.close()
    assert [c.name for c in concerns] == ["first"] and first.seen == [("close", ())] and third.seen == []


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
