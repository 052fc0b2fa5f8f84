"""The concerns that plug into the runner: post-reboot validation, goodput, and the operator's
side (control socket, Prometheus, systemd status). The job's output and heartbeats are
:mod:`supervisor.daemon.watchconcern`."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import structlog

from ..core.causes import Cause
from ..core.messages import EndAttempt, Resume
from ..eventnames import EventName
from ..events import AttemptContext
from ..core.observations import Detection, MetricRecord
from ..core.goodput import Track, goodput_of, tracks_from_rows
from .effects import AttemptField
from .linger import linger
from .ports import Concern, DaemonView, Notifier

if TYPE_CHECKING:  # imported at start, only what is configured (prometheus_client: 12 ms)
    from ..core.validation import Validator, Verdict
    from ..ops.control import ControlServer
    from ..ops.metrics import Metrics
    from .checkpointconcern import CheckpointConcern

log = structlog.get_logger("supervisor.daemon")

STATUS_EVERY_S = 0.25  # the status cache, the Prometheus gauges, systemd's STATUS= line
GOODPUT_EVERY_S = 5.0
INTERVAL_EVERY_S = 60.0


class OpsConcern(Concern):
    """The control socket, the Prometheus endpoint or textfile, systemd's status line."""

    name = "ops"

    def __init__(self, notifier: Notifier, checkpoints: CheckpointConcern | None = None, *,
                 status_interval_s: float = 5.0) -> None:
        self.notifier = notifier
        self.status_interval_s = status_interval_s  # systemd.status_interval_s: STATUS= at most this often
        self._status_sent_at = float("-inf")
        self.checkpoints = checkpoints  # the CheckpointConcern: `restart --from` is verified by its service
        self.control: ControlServer | None = None
        self.metrics: Metrics | None = None
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
            daemon.control, lambda: daemon.cfg, daemon.state_dir,
            lambda: self.checkpoints.svc if self.checkpoints is not None else None))
        self.control.start()
        mc = daemon.cfg.metrics
        if mc.listen or mc.textfile:
            from ..ops.metrics import Metrics  # prometheus_client: 12 ms of imports, only when asked for

            self.metrics = Metrics(mc, name=daemon.cfg.job.name)
            try:
                self.metrics.start()
            except OSError as e:  # a taken port must not stop the supervision of a training run
                daemon.event("metrics_unavailable", "error", f"cannot serve Prometheus metrics on {mc.listen}: "
                             f"{e}; supervising without the endpoint")
            path = self.metrics.textfile_path()
            if path:
                from ..ops.textfiles import same_name_elsewhere

                others = same_name_elsewhere(path, daemon.cfg.job.name)
                if others:
                    daemon.event("metrics_textfile_name_taken", "warning",
                                 f"{', '.join(others)} beside this run's textfile {path} also export a run named "
                                 f"{daemon.cfg.job.name!r}: node_exporter rejects the series both repeat (neither "
                                 "run's state is collected); give this run its own [job] name, or delete the other "
                                 "file if its run is over", textfile=path, others=others)

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
        if self.metrics is not None:
            try:
                linger(self.metrics, self.notifier)
            except Exception as e:  # the exit must not wait on a failed wait
                log.warning("metrics_linger_ended", error=repr(e), message=f"the wait for a last scrape failed: {e!r}; "
                            "exiting now")
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
            self.tracks = tracks_from_rows(daemon.history.attempts(daemon.run_id), daemon.history.metrics(daemon.run_id))
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
        # Imported at the first status, not at start: the checkpoint layouts it reads are not on
        # the first launch's way (issue 25 build 1).
        from ..checkpoints.cadence import interval_advice

        try:
            ckdir = d.cfg.checkpoints.dir
            advice = interval_advice(d.history, d.run_id, Path(ckdir) if ckdir else None)
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
        self.validator: Validator | None = None
        self.last: dict[str, Any] | None = None
        self.daemon: DaemonView | None = None

    def start(self, daemon: DaemonView) -> None:
        self.daemon = daemon

    def attempt_started(self, ctx: AttemptContext, resume: Resume, wall: float) -> None:
        d = self.daemon
        assert d is not None
        self.validator = None
        vc = d.cfg.validation
        # A checkpoint the job is not known to take (only in TSUP_RESUME_FROM; resume_unavailable
        # said so) is no resume to validate: its verdict would blame the job for what it never got.
        if not (resume.checkpoint and resume.handed and vc.enabled):
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

    def _verdict(self, verdict: Verdict | None) -> None:
        if verdict is None:
            return
        d = self.daemon
        assert d is not None
        js = verdict.to_json()
        self.last = js
        d.apply(AttemptField(d.attempt, validation=js))
        if verdict.passed:
            d.event("validation_passed", "info", f"post-reboot validation {verdict.summary}", checks=js["checks"])
            return
        from ..core.resumecheck import CHECK_NAME as RESUME_CHECK

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
                         step=max(seen) if seen else None, onset_step=verdict.resume_step, details=js,
                         at=d.clock.time()))

    def attempt_ended(self, end: EndAttempt, resume: Resume, wall: float) -> None:
        if self.validator is not None and self.validator.verdict is None:
            inc = self.validator.incomplete()
            assert self.daemon is not None
            self.daemon.apply(AttemptField(end.attempt, validation=inc))
            self.last = inc
        self.validator = None

    def status(self) -> dict[str, Any]:
        return {"validation": self.last}
