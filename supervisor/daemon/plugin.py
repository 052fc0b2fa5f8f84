"""The plug-in contract: what a plug-in is told (a frozen notice and the frozen :class:`RunView`
of the loop's turn) and what it answers (effects, :mod:`supervisor.daemon.effects`).

A plug-in has one small base class per capability it has (reacts to the daemon's start, to
attempts, to metric batches, to ticks; gives status fields, monitors, the job's env; closes).
Each reaction is ``(notice, run) -> effects``: it reads the notice and the view, keeps its own
state, and returns what the daemon should do; the runner carries the effects out. A plug-in holds
no reference to the daemon, the runner or another plug-in, and is no port (the architecture test
fails on each), so every reaction is tested as a plain function call (tests/daemon/test_plugins.py).

The runner's plug-ins taken together are a :class:`ConcernSet`: started in order, every notice
given to each that reacts to it, one that fails reported while the others go on; the effects a
reaction returns carried out by the runner, in order; and what they add to the job's env, status
and snapshots.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Protocol, Sequence

import structlog

from ..core.machine import State
from ..core.messages import EndAttempt, Resume
from ..core.observations import Detection, MetricRecord
from ..core.policy import Decision
from ..core.runend import EndFacts
from ..events import AttemptContext, Monitor
from ..levels import Level
from .effects import Effect

log = structlog.get_logger("supervisor.daemon.runner")

if TYPE_CHECKING:
    from pathlib import Path

    from ..config.model import Config
    from ..ledger.store import AttemptRow

Effects = Sequence[Effect]


class HistoryReader(Protocol):
    """What plug-ins read of the ledger (goodput's tracks, the checkpoint interval advice): reads
    only. Every write is an effect the runner carries out (a note, an attempt's field)."""

    def attempts(self, run_id: str) -> list[AttemptRow]: ...

    def metrics(self, run_id: str) -> Iterator[Any]: ...

    def failure_record(self) -> tuple[float, int, list[float]]: ...

    def recent_step_times(self, run_id: str, limit: int = 5000) -> list[float]: ...


@dataclass(frozen=True)
class RunView:
    """The run as it stands at one turn of the loop (built again only when the machine moved or
    the config was replaced in the turn): the config in force and what plug-ins read of the state
    machine, copied, so that none reaches into it and none sees the config change under its feet
    (a reload or a found checkpoint dir takes effect at the next view). Safe to keep, any thread."""

    cfg: Config
    run_id: str
    state_dir: Path
    state: State
    attempt: int  # -1 before the first launch
    has_job: bool  # a job was spawned for the current attempt (it may have exited since)
    root: Detection | None  # the first failure of this attempt (what a stop under way is for)
    decision: Decision | None  # what follows the stop under way: a relaunch or a give-up (None: none decided)
    resume: Resume  # where the current attempt started from
    last_metric: MetricRecord | None  # the attempt's newest metric record kept
    exit_code: int | None  # once the run is over: the daemon's exit code
    exit_reason: str
    now: float  # the turn's monotonic clock
    wall: float  # the turn's wall clock


@dataclass(frozen=True)
class DaemonStarted:
    """Once, after the run was opened: the ledger to read (goodput's history), never to write,
    ``status`` as the control socket answers it (the status cache: from any thread, never the loop),
    ``refresh``: the status built now (the cache refreshed: on the loop only, a tick or a note), and
    ``control``: the control socket's requests handed to the loop, each waited for (its threads)."""

    history: HistoryReader
    status: Callable[[], Mapping[str, Any]]
    refresh: Callable[[], Mapping[str, Any]] = dict
    control: Callable[[str, Mapping[str, Any]], Any] = lambda verb, args: None
    # From threads of the plug-in's own (readers of the job's output): ``hand`` an effect to the
    # runner's inbox (carried out on the loop; a Detect fed like a monitor's), ``keep`` a metric
    # record of the job's (the loop's metric buffer, which keeps them a chunk per turn).
    hand: Callable[[Effect], None] = lambda effect: None
    keep: Callable[[MetricRecord], None] = lambda record: None


@dataclass(frozen=True)
class AttemptSpawning:
    """Right before the job of ``attempt`` is spawned from ``resume``: before its first line can arrive."""

    attempt: int
    resume: Resume


@dataclass(frozen=True)
class AttemptStarted:
    """The job of ``ctx.attempt`` was spawned from ``resume``; ``history``: the metric records kept before it."""

    ctx: AttemptContext
    resume: Resume
    wall: float
    history: Sequence[MetricRecord]


@dataclass(frozen=True)
class JobHung:
    """Before the hung job of ``attempt`` is stopped (``pids``: its processes), on the loop, which waits."""

    attempt: int
    pids: Sequence[int]


@dataclass(frozen=True)
class AttemptEnded:
    end: EndAttempt
    resume: Resume  # where the ended attempt had started from
    wall: float


@dataclass(frozen=True)
class MetricsBatch:
    """Records the loop kept this turn, in order (``now``: monotonic)."""

    records: Sequence[MetricRecord]
    now: float


@dataclass(frozen=True)
class Tick:
    now: float  # monotonic


Notice = DaemonStarted | AttemptSpawning | AttemptStarted | JobHung | AttemptEnded | MetricsBatch | Tick


@dataclass(frozen=True)
class Noted:
    """One daemon event as recorded (log, journal, ledger), told from the thread that recorded it:
    the one notice without a view (its reaction is short, on any thread); ``at``/``now``: the
    daemon's wall and monotonic clocks then."""

    event: str
    level: Level
    message: str
    data: Mapping[str, Any]
    run_id: str
    attempt: int | None
    at: float
    now: float


class Plugin:
    """A part of the daemon that only reacts; its capabilities are the bases below."""

    name = "plugin"


class OnStart(Plugin):
    def started(self, n: DaemonStarted, run: RunView) -> Effects:
        raise NotImplementedError


class OnAttempts(Plugin):
    def attempt_spawning(self, n: AttemptSpawning, run: RunView) -> Effects:
        return ()

    def attempt_started(self, n: AttemptStarted, run: RunView) -> Effects:
        return ()

    def job_hung(self, n: JobHung, run: RunView) -> Effects:
        return ()

    def attempt_ended(self, n: AttemptEnded, run: RunView) -> Effects:
        return ()


class OnMetrics(Plugin):
    def metrics(self, n: MetricsBatch, run: RunView) -> Effects:
        raise NotImplementedError


class OnTicks(Plugin):
    def tick(self, n: Tick, run: RunView) -> Effects:
        raise NotImplementedError


class GivesStatus(Plugin):
    def status(self, run: RunView) -> Mapping[str, Any]:
        raise NotImplementedError


class GivesMonitors(Plugin):
    def monitors(self, run: RunView) -> Sequence[Monitor]:
        raise NotImplementedError

    def snapshot(self) -> Mapping[str, Any]:
        """What the attempt runs on, as its monitors saw it (for the ledger)."""
        return {}


class GivesJobEnv(Plugin):
    def job_env(self, run: RunView) -> Mapping[str, str]:
        raise NotImplementedError


class GivesEndFacts(Plugin):
    def end_facts(self, facts: EndFacts, keepalive: Callable[[], bool], run: RunView) -> EndFacts:
        """The job exited 0: ``facts`` with this plug-in's part of the end filled in (what it watched,
        what it checked: supervisor.core.runend). On the loop, which waits for it: call ``keepalive``
        (systemd's watchdog) at least every few seconds of a long check, and give the check up (said
        as not done) once it returns False (a stop was asked for)."""
        raise NotImplementedError


class OnNotes(Plugin):
    def noted(self, n: Noted) -> Effects:
        raise NotImplementedError


class GivesLiveStatus(Plugin):
    def live_status(self) -> Mapping[str, Any]:
        """Status fields read on every ``status`` request over the cached snapshot, from the
        control threads (plain reads, or a bounded wait on a thread of its own)."""
        raise NotImplementedError


class Closes(Plugin):
    def close(self) -> Effects | None:
        """At the daemon's exit; its last effects (notes) are carried out before the ledger closes."""
        raise NotImplementedError


def reaction(p: Plugin, n: Notice) -> Callable[[RunView], Effects] | None:
    """``p``'s reaction to ``n``, or None when it has not that capability."""
    match n:
        case DaemonStarted() if isinstance(p, OnStart):
            return lambda run: p.started(n, run)
        case AttemptSpawning() if isinstance(p, OnAttempts):
            return lambda run: p.attempt_spawning(n, run)
        case AttemptStarted() if isinstance(p, OnAttempts):
            return lambda run: p.attempt_started(n, run)
        case JobHung() if isinstance(p, OnAttempts):
            return lambda run: p.job_hung(n, run)
        case AttemptEnded() if isinstance(p, OnAttempts):
            return lambda run: p.attempt_ended(n, run)
        case MetricsBatch() if isinstance(p, OnMetrics):
            return lambda run: p.metrics(n, run)
        case Tick() if isinstance(p, OnTicks):
            return lambda run: p.tick(n, run)
    return None


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
