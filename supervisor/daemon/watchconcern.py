"""The job's output (the log watcher and its detectors), its heartbeats and liveness, and the
files it writes (tailed lines, metric files), watched for every attempt."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence, cast

from ..core.runend import EndFacts, SourceSeen
from ..eventnames import EventName
from ..events import Monitor
from ..core.observations import Detection, MetricRecord
from ..levels import Level
from .concerns import close_each
from .effects import Detect, Effect, Note, RefreshStatus
from .plugin import (AttemptEnded, AttemptSpawning, AttemptStarted, Closes, DaemonStarted, Effects, GivesEndFacts,
                     GivesJobEnv, GivesMonitors, GivesStatus, JobHung, OnAttempts, OnStart, OnTicks, RunView, Tick)

if TYPE_CHECKING:  # imported once the first job is spawned: none of the watchers is on its way
    from ..config.model import Config
    from .ports import Clock
    from ..watch.heartbeat import HeartbeatMonitor
    from ..watch.logwatch import LogWatcher
    from ..watch.look import LookResult
    from ..watch.metricfiles import MetricFiles
    from ..watch.sources import SourceBook
    from ..watch.tail import FileTailer


class HeldLines:
    """The log watcher's place on the job's output before it exists: the lines (and metric-file
    records) that come meanwhile are held, then handed over in order when it is attached. The
    first job is spawned before the watchers are built (their imports and regexes cost tens of
    ms: issue 25 build 1); its pipes are read from the start, and no line misses a detector."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: list[tuple[str, Sequence[str] | None, Sequence[MetricRecord] | None]] = []
        self._target: LogWatcher | None = None
        self._dropping = False

    def feed(self, source: str, lines: Sequence[str]) -> None:
        self._pass(source, lines, None)

    def feed_records(self, source: str, records: Sequence[MetricRecord]) -> None:
        self._pass(source, None, records)

    def feed_ahead(self, source: str, lines: Sequence[str]) -> None:
        target = self._target
        if target is not None:  # not attached yet: the lines are judged in order once it is
            target.feed_ahead(source, lines)

    def _pass(self, source: str, lines: Sequence[str] | None, records: Sequence[MetricRecord] | None) -> None:
        target = self._target  # attached: no lock on the pumps' way
        if target is None:
            with self._lock:  # the pump threads feed; attach() runs on the main loop
                target = self._target
                if target is None:  # held, in order; attach() hands them over before anything newer
                    if not self._dropping:
                        self._held.append((source, None if lines is None else list(lines),
                                           None if records is None else list(records)))
                    return
        if lines is not None:
            target.feed(source, lines)
        elif records is not None:
            target.feed_records(source, records)

    @property
    def sources(self) -> SourceBook | None:
        """The attached log watcher's source book (the metric files' writer rule reads the job's step there)."""
        return None if self._target is None else self._target.sources

    def note_unread(self, source: str, line: str, why: str) -> None:
        if self._target is not None:  # the metric files are read once it is attached (monitors() builds it)
            self._target.note_unread(source, line, why)

    def attach(self, target: LogWatcher) -> None:
        """From now on ``target`` gets everything, first what was held meanwhile."""
        with self._lock:
            held, self._held = self._held, []
            for source, lines, records in held:
                if lines is not None:
                    target.feed(source, lines)
                elif records is not None:
                    target.feed_records(source, records)
            self._target = target

    def drop(self) -> None:
        """The watchers could not be built: nothing will take the lines (job.log still has them)."""
        with self._lock:
            self._held, self._dropping = [], True


class WatchPlugin(OnStart, OnAttempts, OnTicks, GivesMonitors, GivesJobEnv, GivesStatus, GivesEndFacts, Closes):
    """The job's output (log watcher and detectors), its heartbeats and liveness, tailed files.

    The job's lines reach it through :attr:`lines` (the wiring adds it to the output fanout); the
    readers' detections and metric records go to the runner through ``DaemonStarted.hand`` (a
    ``Detect`` in its inbox) and ``keep`` (its metric buffer). What the main loop's watchers say
    (a suspected hang, a build that failed) is returned from the next reaction."""

    name = "watch"

    def __init__(self, clock: Clock | None = None) -> None:
        if clock is None:
            from ..job.osapi import Clock as RealClock

            clock = RealClock()
        self.clock = clock  # the daemon's: the watchers' times and the run's clocks agree
        self.heartbeat: HeartbeatMonitor | None = None
        self.logwatch: LogWatcher | None = None
        self.tailer: FileTailer | None = None
        self.metric_files: MetricFiles | None = None
        self._roots_of: Config | None = None  # the config whose checkpoint dir the metric files last took
        self.cfg: Config | None = None  # the config of the last view (a reload, a found checkpoint dir)
        self.state_dir: Path | None = None
        self._hand: Callable[[Effect], None] = lambda effect: None
        self._keep: Callable[[MetricRecord], None] = lambda record: None
        self._said: deque[Note] = deque()  # said on the main loop outside a reaction, returned from the next
        self.lines = HeldLines()
        self._built = False
        self._reset: tuple[int, int | None] | None = None  # attempt_spawning's reset, for a log watcher built later

    def started(self, n: DaemonStarted, run: RunView) -> Effects:
        """Only what must be there before the first spawn: the tailed files' baseline (what they
        hold before the job starts). The watchers themselves are built right after the spawn
        (:meth:`build`)."""
        self.cfg, self.state_dir, self._hand, self._keep = run.cfg, run.state_dir, n.hand, n.keep
        cfg = run.cfg
        if cfg.job.watch_files:
            from ..watch.tail import FileTailer

            self.tailer = FileTailer(list(cfg.job.watch_files), cfg.workdir(), self.lines)
        if cfg.detectors.metric_files or cfg.job.watch_files:
            self.metric_files = metric_files_monitor(cfg, run.state_dir, self.lines)
        return ()

    def build(self, run: RunView) -> None:
        """The heartbeat monitor and the log watcher with its detectors, once (the first attempt's
        monitors are asked for right after its spawn). A failure is said and the daemon goes on
        without them (no detection from the job's output; job.log keeps every line)."""
        if self._built:
            return
        self._built = True
        try:
            self._build(run.cfg)
        except Exception as e:
            self.lines.drop()
            self.heartbeat = self.logwatch = None
            self._said.append(Note(EventName.MONITOR_FAILED, Level.ERROR, f"the log watcher and heartbeat monitor "
                                   f"could not be built ({e!r}); the job runs on without detection from its output "
                                   "or heartbeats (job.log still has every line)",
                                   {"monitor": "LogWatcher", "error": repr(e)}))

    def _build(self, cfg: Config) -> None:
        from ..watch.hanggate import system_gate
        from ..watch.heartbeat import HeartbeatMonitor
        from ..watch.logwatch import LogWatcher

        plugin = self

        class _ToLogWatch:
            # The heartbeat monitor tails the client's metric files into the log watcher, which in
            # turn tells the heartbeat monitor about progress: this breaks the construction cycle.
            def feed(self, source: str, lines: Any) -> None:
                if plugin.logwatch is not None:  # made right after the heartbeat monitor
                    plugin.logwatch.feed(source, lines)

        hand = self._hand
        self.heartbeat = HeartbeatMonitor(cfg.heartbeat, metrics_sink=_ToLogWatch(), wall=self.clock.time,
                                          gate=system_gate(cfg.heartbeat, self._hang_suspected))
        logwatch = LogWatcher(cfg.detectors, lambda d: hand(Detect(d)), self._keep, progress=self.heartbeat,
                              clock=self.clock.monotonic)
        if self._reset is not None:
            logwatch.reset(*self._reset)
        self.logwatch = logwatch
        self.lines.attach(logwatch)

    def monitors(self, run: RunView) -> list[Monitor]:
        self.build(run)
        return [m for m in (self.heartbeat, self.tailer, self.metric_files) if m is not None]

    def job_env(self, run: RunView) -> dict[str, str]:
        from ..watch.config import client_env

        return client_env(run.cfg.heartbeat)

    def attempt_spawning(self, n: AttemptSpawning, run: RunView) -> Effects:
        """Detectors start afresh for the new attempt before its first line can arrive; the
        tailed files' history is what they hold before the job starts, not when the tailer does."""
        if self.tailer is not None:
            self.tailer.baseline()
        if self.metric_files is not None:
            self.metric_files.baseline()
        self._reset = (n.attempt, n.resume.step if n.resume.checkpoint else None)
        if self.logwatch is not None:
            self.logwatch.reset(*self._reset)
        return ()

    def attempt_started(self, n: AttemptStarted, run: RunView) -> Effects:
        """metrics_blind names the files this attempt writes (its metrics may be there), never the
        supervisor's own output (told apart by file identity: supervisor.watch.candidates)."""
        self.cfg = run.cfg
        said = self._take_said()  # the watchers' build, right before (monitors)
        if self.logwatch is None:
            return said
        from ..watch.candidates import Written, own_output, written_files
        from ..watch.consolecopies import ConsoleCopies

        state_dir, wall = run.state_dir, n.wall

        def find() -> list[Written]:
            cfg = self.cfg or run.cfg  # the last view's when due: a checkpoint dir found meanwhile is searched too
            # Our console too where it is piped into a file (`wrap ... | tee train.log`).
            own = own_output(state_dir, [cfg.log_file()]) | ConsoleCopies().identities()
            ckpt = cfg.checkpoint_dir()
            roots = [Path(cfg.workdir())] + ([ckpt] if ckpt is not None else [])
            return written_files(roots, wall - 1.0, own, skip_dirs=[state_dir])

        self.logwatch.blind.find_written = find
        return said

    def attempt_ended(self, n: AttemptEnded, run: RunView) -> Effects:
        """The attempt's last NaN warnings (its output is read to the end by now), before the next."""
        said = self._take_said() + self._nan_notes()
        if self.logwatch is not None:  # no run time passes for metrics_blind between attempts, nor after
            self.logwatch.blind.ended()
        return said

    def job_hung(self, n: JobHung, run: RunView) -> Effects:
        """Before a hung job is killed: every process's Python stack, into the state dir."""
        hb, pids = run.cfg.heartbeat, n.pids
        if not hb.dump_stacks or not pids:
            return ()
        looked = self.heartbeat.fired_stacks() if self.heartbeat is not None else None
        if looked is not None:  # the look that judged it hung took them a moment ago
            return [Note(EventName.STACKS_DUMPED, Level.WARNING, f"the Python stacks of the hung job (the samples "
                         f"of each process, taken by the look that found it hung) are in {looked}", {"path": looked})]
        from ..watch.stacks import dump_stacks

        path = dump_stacks(pids, run.state_dir / "stacks", native=hb.dump_stacks_native,
                           timeout_s=hb.dump_stacks_timeout_s, label=f"attempt{n.attempt}-hang")
        if path is not None:
            return [Note(EventName.STACKS_DUMPED, Level.WARNING, f"saved the Python stacks of the hung job "
                         f"({len(pids)} processes) to {path} before stopping it", {"path": str(path)})]
        return [Note(EventName.STACKS_UNAVAILABLE, Level.WARNING, "py-spy is not installed: no stack dump of the "
                     "hung job (reinstall transformer-supervisor with its dependencies)", ledger_only=True)]

    def tick(self, n: Tick, run: RunView) -> Effects:
        """``metrics_blind`` (once per run) and ``metrics_seen``: said here, on the main loop, like
        every daemon event (journal, console, ledger), never from a reader thread."""
        self.cfg = run.cfg
        said: list[Effect] = list(self._take_said())
        if self.logwatch is None:
            return said
        if self.metric_files is not None and run.cfg is not self._roots_of:
            self._follow_checkpoint_dir(run.cfg)
        notice = self.logwatch.blind_notice(n.now)
        if notice is not None:
            # `status` read right after the console line must show it, not a snapshot from before.
            said += [Note(cast(EventName, notice.event), notice.level, notice.message, notice.data), RefreshStatus()]
        return said + self._nan_notes()

    def _take_said(self) -> list[Effect]:
        said: list[Effect] = []
        while self._said:
            said.append(self._said.popleft())
        return said

    def _nan_notes(self) -> list[Effect]:
        """``nan_mentioned`` and ``eval_nonfinite``: warnings, never a stop (watch/nannotes.py)."""
        if self.logwatch is None:
            return []
        return [Note(cast(EventName, m.event), m.level, m.message, m.data) for m in self.logwatch.take_notices()]

    def end_facts(self, facts: EndFacts, keepalive: Callable[[], bool], run: RunView) -> EndFacts:
        """The metric sources seen in this daemon's life: the log watcher's book, which every source
        (output lines, metric files, the client's reports) feeds, each record noted there."""
        if self.logwatch is None:
            return facts  # no watcher: nothing was seen
        mono, wall = self.clock.monotonic(), self.clock.time()
        mf = self.metric_files  # its reader thread may add a withheld file now: copy() is one step under the GIL
        return replace(facts, sources=tuple(SourceSeen(s.source, s.formats, s.records, s.last_step,
                                                       wall - max(0.0, mono - s.at), s.unread)
                                            for s in self.logwatch.sources.states()),
                       withheld=tuple(mf.writers.withheld_files.copy().items()) if mf is not None else ())

    def _hang_suspected(self, det: Detection, look: LookResult, busy_for_s: float) -> None:
        """A silent job the look found busy (the heartbeat monitor's poll, on the main loop): said
        at this turn's tick."""
        assert self.cfg is not None  # set at the start, before any watcher is built
        max_busy_s = self.cfg.heartbeat.max_busy_s
        left = max_busy_s - busy_for_s
        self._said.append(Note(
            EventName.HANG_SUSPECTED, Level.WARNING, f"{det.summary}, but the job is busy: {look.verdict.reason}; "
            f"not stopped (looked again later; a hang anyway in {left:.0f} s, [heartbeat] max_busy_s)",
            {"summary": det.summary, "busy_for_s": round(busy_for_s, 1), "max_busy_s": max_busy_s,
             "look": look.to_json(), "stacks": str(look.stacks_file) if look.stacks_file else None,
             "next": "extended: the job is looked at again after the timeout"}))

    def status(self, run: RunView) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.logwatch is not None:
            # Which of the job's outputs yield metrics, and the last step of each; and whether the
            # run is blind (no step parsed: the fix is in metrics_blind.fix).
            out["metric_sources"] = self.logwatch.sources.snapshot()
            out["metrics_blind"] = self.logwatch.blind.status()
        if self.metric_files is not None:
            out["metric_files"] = self.metric_files.status()  # the roots searched, the files followed
        if self.heartbeat is not None:
            out["heartbeats"] = {str(k): round(v, 3) for k, v in self.heartbeat.heartbeats().items()}
            # The hang timeout in force and where it came from (initial, provisional, learned from the
            # output or a metric file, configured): a sparse logger's 15 min wait shows here.
            out["hang_timeout"] = self.heartbeat.timeout_in_force()
        return out

    def _follow_checkpoint_dir(self, cfg: Config) -> None:
        """A checkpoint dir found after the start (from the command, or from files appearing) or
        set by a reload is where trainers log too (HF ``output_dir/runs/``): search it as well."""
        self._roots_of = cfg
        ckpt = cfg.checkpoint_dir() if cfg.detectors.metric_files else None
        if ckpt is not None and self.metric_files is not None:
            self.metric_files.add_root(ckpt)

    def close(self) -> None:
        close_each(self.heartbeat, self.tailer, self.metric_files)


def metric_files_monitor(cfg: Config, state_dir: Path, logwatch: LogWatcher | HeldLines) -> MetricFiles:
    """The metric-file follower: the working dir and the checkpoint dir searched when
    ``[detectors] metric_files`` is on; event files named in ``[job] watch_files`` always (the
    line tailer skips them: they are binary)."""
    import os

    from ..watch.metricfiles import MetricFiles

    dc = cfg.detectors
    cwd = cfg.workdir()
    roots: list[Path] = []
    if dc.metric_files:
        roots.append(Path(cwd))
        ckpt = cfg.checkpoint_dir()
        if ckpt is not None:
            roots.append(ckpt)
    from ..job.keeper import stderr_log_path
    from ..watch.parsers import MetricParser

    globs = [g if os.path.isabs(g) else os.path.join(str(cwd), g) for g in cfg.job.watch_files]
    log_file = cfg.log_file()  # the job's output copy: read from the job's pipes already, never again
    return MetricFiles(roots, logwatch, depth=dc.metric_files_depth, max_dirs=dc.metric_files_max_dirs,
                       poll_interval_s=dc.metric_files_poll_s, globs=globs, exclude=[Path(state_dir)],
                       own_files=[log_file, Path(stderr_log_path(str(log_file)))],
                       parser=MetricParser(dc.parsers.regexes, auto=dc.parsers.auto,
                                           max_line_chars=dc.parsers.max_line_chars))
