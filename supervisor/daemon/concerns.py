"""The concerns that plug into the runner: the job's output and heartbeats, post-reboot
validation, goodput, and the operator's side (control socket, Prometheus, systemd status)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Mapping, Sequence

import structlog

from ..checkpoints.cadence import interval_advice
from ..core.causes import Cause
from ..core.messages import EndAttempt, Resume
from ..eventnames import EventName
from ..events import AttemptContext, Detection, MetricRecord, Monitor
from ..core.goodput import Track, goodput_of, tracks_from_rows
from ..core.resumecheck import CHECK_NAME as RESUME_CHECK
from .ports import Concern, DaemonView, Notifier

log = structlog.get_logger("supervisor.daemon")

STATUS_EVERY_S = 0.25  # the status cache, the Prometheus gauges, systemd's STATUS= line
GOODPUT_EVERY_S = 5.0
INTERVAL_EVERY_S = 60.0


class OpsConcern(Concern):
    """The control socket, the Prometheus endpoint or textfile, systemd's status line."""

    name = "ops"

    def __init__(self, notifier: Notifier, checkpoints: Any = None, *, status_interval_s: float = 5.0) -> None:
        self.notifier = notifier
        self.status_interval_s = status_interval_s  # systemd.status_interval_s: STATUS= at most this often
        self._status_sent_at = float("-inf")
        self.checkpoints = checkpoints  # the CheckpointConcern: `restart --from` is verified by its service
        self.control: Any = None
        self.metrics: Any = None
        self.daemon: DaemonView | None = None
        self._last_status = float("-inf")
        self._status_line = ""
        self._loop_thread = threading.get_ident()

    def start(self, daemon: DaemonView) -> None:
        from ..ops.control import ControlServer

        self.daemon = daemon
        self._loop_thread = threading.get_ident()  # start() runs on the main loop's thread
        from .restartfrom import gate_restart_from

        self.control = ControlServer(daemon.state_dir, gate_restart_from(
            daemon.control, lambda: daemon.cfg, daemon.state_dir, lambda: getattr(self.checkpoints, "svc", None)))
        self.control.start()
        mc = daemon.cfg.metrics
        if mc.listen or mc.textfile:
            from ..ops.metrics import Metrics  # prometheus_client: 12 ms of imports, only when asked for

            self.metrics = Metrics(mc)
            try:
                self.metrics.start()
            except OSError as e:  # a taken port must not stop the supervision of a training run
                daemon.event("metrics_unavailable", "error", f"cannot serve Prometheus metrics on {mc.listen}: "
                             f"{e}; supervising without the endpoint")

    def rebind_control(self) -> None:
        """Bind the control socket again in a re-created state dir (the old file went with the old
        dir: no client could reach the socket still listening on it)."""
        from ..ops.control import ControlServer

        old = self.control
        if old is None:
            return
        self.control = ControlServer(self.daemon.state_dir if self.daemon else old.path.parent, old.handler)
        old.close()  # unlinks only its own file: the new dir has none yet
        self.control.start()

    def tick(self, now: float) -> None:
        if self.daemon is None or now - self._last_status < STATUS_EVERY_S:
            return
        self._last_status = now
        st = self.daemon.refresh_status_cache()
        if self.metrics is not None:
            try:
                self.metrics.update(st)
            except Exception as e:
                log.warning("metrics_update_failed", error=repr(e))
        line = status_line(st)
        # A changed line goes out once the interval since the last one has passed (a later tick
        # sends it then): systemd's STATUS= never goes stale, and is not rewritten 4 times a second.
        if line != self._status_line and now - self._status_sent_at >= self.status_interval_s:
            self._status_line, self._status_sent_at = line, now
            self.notifier.status(line)

    def on_event(self, event: str, level: str, message: str, data: Mapping[str, Any]) -> None:
        # The give-up ends the loop: no tick publishes the gave_up state, and the daemon may stay
        # up a while (notify.shutdown_wait_s) with its listener answering. Publish it now, on the
        # loop's own thread only (events from other threads leave it to the next tick).
        if event == EventName.GAVE_UP and threading.get_ident() == self._loop_thread:
            self._publish_final()

    def _publish_final(self) -> None:
        if self.metrics is not None and self.daemon is not None:
            try:  # the final state (stopped, gave_up) reaches the textfile before the daemon is gone
                self.metrics.final(self.daemon.refresh_status_cache())
            except Exception as e:
                log.warning("metrics_final_failed", error=repr(e), next="the textfile keeps the last state written")

    def close(self) -> None:
        self._publish_final()
        close_each(self.control, self.metrics)


def close_each(*parts: Any) -> None:
    """Close every part; one that fails is logged and the others are still closed."""
    for part in parts:
        if part is not None:
            try:
                part.close()
            except Exception as e:
                log.warning("part_close_failed", part=type(part).__name__, error=repr(e))


def status_line(st: Mapping[str, Any]) -> str:
    """systemd's STATUS= line: state, attempt, step, loss."""
    lm = st.get("last_metric") or {}
    parts = [f"{st.get('state')}", f"attempt {st.get('attempt')}"]
    if lm.get("step") is not None:
        parts.append(f"step {lm['step']}")
    if lm.get("loss") is not None:
        parts.append(f"loss {lm['loss']:.4g}")
    return ", ".join(parts)


class WatchConcern(Concern):
    """The job's output (log watcher and detectors), its heartbeats and liveness, tailed files."""

    name = "watch"

    def __init__(self) -> None:
        self.heartbeat: Any = None
        self.logwatch: Any = None
        self.tailer: Any = None
        self.metric_files: Any = None
        self._roots_of: Any = None  # the config whose checkpoint dir the metric files last took
        self.daemon: DaemonView | None = None

    def start(self, daemon: DaemonView) -> None:
        from ..watch.hanggate import system_gate
        from ..watch.heartbeat import HeartbeatMonitor
        from ..watch.logwatch import LogWatcher
        from ..watch.tail import FileTailer

        self.daemon = daemon
        cfg = daemon.cfg
        concern = self

        class _ToLogWatch:
            # The heartbeat monitor tails the client's metric files into the log watcher, which in
            # turn tells the heartbeat monitor about progress: this breaks the construction cycle.
            def feed(self, source: str, lines: Any) -> None:
                concern.logwatch.feed(source, lines)

        self.heartbeat = HeartbeatMonitor(cfg.heartbeat, metrics_sink=_ToLogWatch(), wall=daemon.clock.time,
                                          gate=system_gate(cfg.heartbeat, self._hang_suspected))
        self.logwatch = LogWatcher(cfg.detectors, daemon.emit, daemon.on_metric, progress=self.heartbeat,
                                   clock=daemon.clock.monotonic)
        daemon.fanout.add(self.logwatch)
        if cfg.job.watch_files:
            self.tailer = FileTailer(list(cfg.job.watch_files), cfg.workdir(), self.logwatch)
        if cfg.detectors.metric_files or cfg.job.watch_files:
            self.metric_files = metric_files_monitor(cfg, daemon.state_dir, self.logwatch)

    def monitors(self) -> list[Monitor]:
        return [m for m in (self.heartbeat, self.tailer, self.metric_files) if m is not None]

    def job_env(self) -> dict[str, str]:
        from ..watch.heartbeat import client_env

        assert self.daemon is not None
        return client_env(self.daemon.cfg.heartbeat)

    def before_spawn(self, attempt: int, resume: Resume) -> None:
        """Detectors start afresh for the new attempt before its first line can arrive; the
        tailed files' history is what they hold before the job starts, not when the tailer does."""
        if self.tailer is not None:
            self.tailer.baseline()
        if self.metric_files is not None:
            self.metric_files.baseline()
        if self.logwatch is not None:
            self.logwatch.reset(attempt, resume.step if resume.checkpoint else None)

    def attempt_started(self, ctx: AttemptContext, resume: Resume, wall: float) -> None:
        """metrics_blind names the text files this attempt writes (their metrics may be there)."""
        d = self.daemon
        if self.logwatch is None or d is None:
            return
        from ..watch.blind import written_files

        cfg = d.cfg
        exclude = [d.state_dir, cfg.log_file()]
        self.logwatch.blind.find_written = lambda: written_files(cfg.workdir(), wall - 1.0, exclude)

    def job_hung(self, attempt: int, pids: Sequence[int]) -> None:
        """Before a hung job is killed: every process's Python stack, into the state dir."""
        d = self.daemon
        assert d is not None
        hb = d.cfg.heartbeat
        if not hb.dump_stacks or not pids:
            return
        looked = self.heartbeat.fired_stacks() if self.heartbeat is not None else None
        if looked is not None:  # the look that judged it hung took them a moment ago
            d.event("stacks_dumped", "warning", f"the Python stacks of the hung job (the samples of each process, "
                    f"taken by the look that found it hung) are in {looked}", path=looked)
            return
        from ..watch.stacks import dump_stacks

        path = dump_stacks(pids, d.state_dir / "stacks", native=hb.dump_stacks_native,
                           timeout_s=hb.dump_stacks_timeout_s, label=f"attempt{attempt}-hang")
        if path is not None:
            d.event("stacks_dumped", "warning", f"saved the Python stacks of the hung job ({len(pids)} "
                    f"processes) to {path} before stopping it", path=str(path))
        else:
            d.event("stacks_unavailable", "warning", "py-spy is not installed: no stack dump of the hung job "
                    "(reinstall transformer-supervisor with its dependencies)", ledger_only=True)

    def tick(self, now: float) -> None:
        """``metrics_blind`` (once per run) and ``metrics_seen``: logged here, on the main loop,
        like every daemon event (journal, console, ledger), never from a reader thread."""
        if self.logwatch is None or self.daemon is None:
            return
        if self.metric_files is not None and self.daemon.cfg is not self._roots_of:
            self._follow_checkpoint_dir(self.daemon.cfg)
        notice = self.logwatch.blind_notice(now)
        if notice is not None:
            self.daemon.event(notice.event, notice.level, notice.message, **notice.data)
            # `status` read right after the console line must show it, not a snapshot from before.
            self.daemon.refresh_status_cache()

    def _hang_suspected(self, det: Detection, look: Any, busy_for_s: float) -> None:
        """A silent job the look found busy (the heartbeat monitor's poll, on the main loop)."""
        d = self.daemon
        assert d is not None
        left = d.cfg.heartbeat.max_busy_s - busy_for_s
        d.event("hang_suspected", "warning", f"{det.summary}, but the job is busy: {look.verdict.reason}; "
                f"not stopped (looked again later; a hang anyway in {left:.0f} s, [heartbeat] max_busy_s)",
                summary=det.summary, busy_for_s=round(busy_for_s, 1), max_busy_s=d.cfg.heartbeat.max_busy_s,
                look=look.to_json(), stacks=str(look.stacks_file) if look.stacks_file else None,
                next="extended: the job is looked at again after the timeout")

    def status(self) -> dict[str, Any]:
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
        return out

    def _follow_checkpoint_dir(self, cfg: Any) -> None:
        """A checkpoint dir found after the start (from the command, or from files appearing) or
        set by a reload is where trainers log too (HF ``output_dir/runs/``): search it as well."""
        self._roots_of = cfg
        ckpt = cfg.checkpoint_dir() if cfg.detectors.metric_files else None
        if ckpt is not None:
            self.metric_files.add_root(ckpt)

    def close(self) -> None:
        close_each(self.heartbeat, self.tailer, self.metric_files)


def metric_files_monitor(cfg: Any, state_dir: Any, logwatch: Any) -> Any:
    """The metric-file follower: the working dir and the checkpoint dir searched when
    ``[detectors] metric_files`` is on; event files named in ``[job] watch_files`` always (the
    line tailer skips them: they are binary)."""
    import os
    from pathlib import Path

    from ..watch.metricfiles import MetricFiles

    dc = cfg.detectors
    cwd = cfg.workdir()
    roots: list[Path] = []
    if dc.metric_files:
        roots.append(Path(cwd))
        ckpt = cfg.checkpoint_dir()
        if ckpt is not None:
            roots.append(ckpt)
    globs = [g if os.path.isabs(g) else os.path.join(str(cwd), g) for g in cfg.job.watch_files]
    return MetricFiles(roots, logwatch, depth=dc.metric_files_depth, max_dirs=dc.metric_files_max_dirs,
                       poll_interval_s=dc.metric_files_poll_s, globs=globs, exclude=[Path(state_dir)])


class GoodputConcern(Concern):
    """Each attempt's progress, for goodput (rebuilt from the ledger after a daemon restart)."""

    name = "goodput"

    def __init__(self) -> None:
        self.tracks: dict[int, Track] = {}
        self.daemon: DaemonView | None = None
        self._cached: dict[str, Any] | None = None
        self._cached_at = float("-inf")
        self._interval: dict[str, Any] | None = None
        self._interval_at = float("-inf")

    def start(self, daemon: DaemonView) -> None:
        self.daemon = daemon
        try:
            self.tracks = tracks_from_rows(daemon.ledger.attempts(daemon.run_id), daemon.ledger.metrics(daemon.run_id))
        except Exception as e:
            log.warning("goodput_history_unreadable", error=repr(e))

    def startups(self, but: int) -> list[float]:
        """Launch -> first step of every attempt except ``but``."""
        return [s for a, t in self.tracks.items() if a != but and (s := t.startup()) is not None]

    def attempt_started(self, ctx: AttemptContext, resume: Resume, wall: float) -> None:
        self.tracks[ctx.attempt] = Track(wall, resume.step if resume.checkpoint else None)

    def on_metrics(self, batch: Sequence[MetricRecord], now: float) -> None:
        assert self.daemon is not None
        track = self.tracks.get(self.daemon.attempt)
        if track is not None:
            for m in batch:
                if m.step is not None:
                    track.add(m.at, m.step)

    def attempt_ended(self, end: EndAttempt, resume: Resume, wall: float) -> None:
        track = self.tracks.get(end.attempt)
        if track is not None:
            track.ended_at = wall
            track.cause = end.cause.value if end.cause else None
        self._cached_at = float("-inf")

    def goodput(self) -> dict[str, Any] | None:
        assert self.daemon is not None
        now = self.daemon.clock.monotonic()
        if now - self._cached_at < GOODPUT_EVERY_S and self._cached is not None:
            return self._cached
        self._cached_at = now
        gp = goodput_of(self.tracks, self.daemon.clock.time())
        self._cached = gp.to_json() if gp is not None else None
        return self._cached

    def status(self) -> dict[str, Any]:
        gp = self.goodput()
        return {"goodput": gp["ratio"] if gp else None, "goodput_detail": gp,
                "checkpoint_interval": self.interval_advice()}

    def interval_advice(self) -> dict[str, Any] | None:
        """The checkpoint interval that maximises goodput for the failure rate measured so far
        (checkpoints/cadence.py), recomputed at most once a minute."""
        assert self.daemon is not None
        now = self.daemon.clock.monotonic()
        # Once a minute; until there is advice (a failure, a save and a step rhythm), every few seconds.
        if now - self._interval_at < (INTERVAL_EVERY_S if self._interval is not None else GOODPUT_EVERY_S):
            return self._interval
        self._interval_at = now
        d = self.daemon
        try:
            ckdir = d.cfg.checkpoints.dir
            advice = interval_advice(d.ledger, d.run_id, Path(ckdir) if ckdir else None)
        except Exception as e:  # advice only: never in the way of a status reply
            log.warning("checkpoint_interval_advice_failed", error=repr(e))
            advice = None
        self._interval = advice.to_json() if advice is not None else None
        return self._interval


class ValidationConcern(Concern):
    """Post-reboot validation: the first steps after every resume against the run before it
    (:mod:`supervisor.core.validation`); a failure becomes a ``validation_failed`` detection."""

    name = "validation"

    def __init__(self, goodput: GoodputConcern) -> None:
        self.goodput = goodput  # earlier attempts' start-up times
        self.validator: Any = None
        self.last: dict[str, Any] | None = None
        self.daemon: DaemonView | None = None

    def start(self, daemon: DaemonView) -> None:
        self.daemon = daemon

    def attempt_started(self, ctx: AttemptContext, resume: Resume, wall: float) -> None:
        d = self.daemon
        assert d is not None
        self.validator = None
        vc = d.cfg.validation
        if not (resume.checkpoint and vc.enabled):
            return
        from ..core.validation import Baseline, Validator

        baseline = Baseline.from_history(list(d.metric_history), resume.step, self.goodput.startups(ctx.attempt))
        self.validator = Validator(vc, baseline, resume.step, ctx.started_monotonic)
        d.event("validation_started", "info",
                f"validating the first {vc.steps} steps after resuming from step {resume.step}"
                + (f" (reference loss {baseline.loss_at_resume:.4g})" if baseline.loss_at_resume is not None
                   else " (no loss recorded at that step: loss check skipped)"),
                reference_loss=baseline.loss_at_resume, grad_norm_p99=baseline.grad_norm_p99,
                throughput_median=baseline.throughput_median)

    def on_metrics(self, batch: Sequence[MetricRecord], now: float) -> None:
        if self.validator is not None:
            self._verdict(self.validator.feed(batch, now))

    def tick(self, now: float) -> None:
        if self.validator is not None and self.daemon is not None and self.daemon.has_job:
            self._verdict(self.validator.poll(now))

    def _verdict(self, verdict: Any) -> None:
        if verdict is None:
            return
        d = self.daemon
        assert d is not None
        js = verdict.to_json()
        self.last = js
        d.ledger.update_attempt(d.run_id, d.attempt, validation_json=js)
        if verdict.passed:
            d.event("validation_passed", "info", f"post-reboot validation {verdict.summary}", checks=js["checks"])
            return
        if [c.name for c in verdict.checks] == [RESUME_CHECK]:
            # The job ignored the checkpoint (resume_ignored, said by ResumeWatchConcern): another
            # relaunch with the same arguments would ignore it again, so the job keeps running.
            d.event("validation_failed", "warning", f"post-reboot validation {verdict.summary}; no restart (it "
                    "would ignore the checkpoint again): the job keeps running", checks=js["checks"])
            return
        d.event("validation_failed", "warning", f"post-reboot validation {verdict.summary}; the resumed state is "
                "suspect", checks=js["checks"])
        seen = self.validator.seen if self.validator else None
        d.emit(Detection(Cause.VALIDATION_FAILED, f"post-reboot validation {verdict.summary}", "validation",
                         step=max(seen) if seen else None, onset_step=verdict.resume_step, details=js))

    def attempt_ended(self, end: EndAttempt, resume: Resume, wall: float) -> None:
        if self.validator is not None and self.validator.verdict is None:
            inc = self.validator.incomplete()
            assert self.daemon is not None
            self.daemon.ledger.update_attempt(self.daemon.run_id, end.attempt, validation_json=inc)
            self.last = inc
        self.validator = None

    def status(self) -> dict[str, Any]:
        return {"validation": self.last}
