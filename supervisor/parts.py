"""Wiring: the concerns that plug into the runner (watchers, checkpoints, health, ops).

The runner calls these hooks at fixed points of an attempt; each hook guards its concern, so a
failing part is reported and the daemon goes on. Keeping the wiring here keeps ``runner.py``
about the state machine alone.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

import structlog

from .events import Action, AttemptContext, Cause, MetricRecord, Monitor

if TYPE_CHECKING:
    from .policy import Decision
    from .runner import Resume, Runner

log = structlog.get_logger("supervisor.parts")

class Parts:
    def __init__(self) -> None:
        self.control: Any = None
        self.notifier: Any = None
        self.gpu_mon: Any = None
        self.host_mon: Any = None
        self.launch_gate: Any = None
        self.ckpt: Any = None  # CheckpointService when a checkpoint dir is configured
        self._newest_at_launch: Any = None
        self._ended: tuple[Any, str, bool, int | None] | None = None
        self._newest_cache: Any = None
        self._verified_key: Any = None
        self._verifier: threading.Thread | None = None
        self._newest_at = float("-inf")
        self.validator: Any = None
        self.last_validation: dict[str, Any] | None = None
        self.tracks: dict[int, _Track] = {}
        self._goodput: dict[str, Any] | None = None
        self._goodput_at = float("-inf")
        self.metrics: Any = None
        self.last_good_at: float | None = None
        self.logwatch: Any = None
        self.heartbeat: Any = None
        self.tailer: Any = None
        self._last_status = 0.0
        self._status_line = ""

    # -- daemon life ----------------------------------------------------------------------
    def start_daemon_side(self, r: "Runner") -> None:
        from .ops.control import ControlServer
        from .ops.notify import Notifier

        sd = r.cfg.systemd
        self.notifier = Notifier(enabled=sd.notify, watchdog_enabled=sd.watchdog)
        self.control = ControlServer(r.state_dir, r.control)
        self.control.start()
        self._start_metrics(r)
        self._start_watch(r)
        self._start_health(r)
        self._start_checkpoints(r)
        self._load_tracks(r)

    def _start_metrics(self, r: "Runner") -> None:
        from .ops.metrics import Metrics

        if not (r.cfg.metrics.listen or r.cfg.metrics.textfile):
            return
        self.metrics = Metrics(r.cfg.metrics)
        try:
            self.metrics.start()
        except OSError as e:  # a taken port must not stop the supervision of a training run
            r._event("metrics_unavailable", "error", f"cannot serve Prometheus metrics on {r.cfg.metrics.listen}: "
                     f"{e}; supervising without the endpoint")

    def _start_watch(self, r: "Runner") -> None:
        from .watch.heartbeat import HeartbeatMonitor
        from .watch.logwatch import LogWatcher
        from .watch.tail import FileTailer

        parts = self

        class _ToLogWatch:
            # The heartbeat monitor tails the client's metric files into the log watcher, which in
            # turn tells the heartbeat monitor about progress: this breaks the construction cycle.
            def feed(self, source: str, lines: Any) -> None:
                parts.logwatch.feed(source, lines)

        self.heartbeat = HeartbeatMonitor(r.cfg.heartbeat, metrics_sink=_ToLogWatch())
        self.logwatch = LogWatcher(r.cfg.detectors, r.emit, r.on_metric, progress=self.heartbeat)
        r.fanout.add(self.logwatch)
        if r.cfg.job.watch_files:
            self.tailer = FileTailer(list(r.cfg.job.watch_files), r.cfg.workdir(), self.logwatch)

    def _load_tracks(self, r: "Runner") -> None:
        """A daemon restarted mid-run rebuilds the goodput timeline from the ledger."""
        try:
            for a in r.ledger.attempts(r.run_id):
                t = self.tracks.setdefault(a.attempt, _Track(a.started_at, a.resume_step))
                t.ended_at, t.cause = a.ended_at, a.cause
            for m in r.ledger.metrics(r.run_id):
                if m["step"] is not None and m["attempt"] in self.tracks:
                    self.tracks[m["attempt"]].add(m["at"], m["step"])
        except Exception as e:
            log.warning("goodput_history_unreadable", error=repr(e))

    def _start_checkpoints(self, r: "Runner") -> None:
        from .checkpoints.service import CheckpointService

        d = r.cfg.checkpoint_dir()
        if d is None:
            return
        d.mkdir(parents=True, exist_ok=True)
        self.ckpt = CheckpointService(r.cfg.checkpoints, d, r.state_dir, r.cfg.job.python, list(r.cfg.job.command),
                                      r.cfg.workdir(), remedy_keys=_remedy_keys(r.cfg))

    def _start_health(self, r: "Runner") -> None:
        from .health import GpuMonitor, HostMonitor, LaunchGate, make_backend

        cfg = r.cfg
        ckdir = cfg.checkpoint_dir()
        try:
            backend = make_backend(cfg.gpu.backend)
        except Exception as e:  # a broken GPU stack must not stop supervision: say we are blind
            r._event("gpu_blind", "warning", f"GPU backend unavailable ({e}); GPU checks say 'unavailable'")
            return
        self.gpu_mon = GpuMonitor(backend, cfg.gpu, on_blind=lambda reason: r._event(
            "gpu_blind", "warning", f"cannot see the GPUs: {reason}; GPU checks are unavailable (never 'healthy')",
            ledger_only=True))
        self.host_mon = HostMonitor(cfg.host, checkpoint_dir=ckdir, state_dir=r.state_dir,
                                    last_checkpoint_bytes=lambda: getattr(self._newest(), "size", None))
        self.launch_gate = LaunchGate(backend, cfg.gpu, checkpoint_dir=ckdir,
                                      storage_probe=cfg.host.storage_probe)

    def stop_daemon_side(self, r: "Runner") -> None:
        if self.notifier is not None:
            self.notifier.stopping()
        if self.control is not None:
            self.control.close()
        for closer in (self.gpu_mon, self.heartbeat, self.tailer, self.metrics):
            if closer is not None:
                try:
                    closer.close()
                except Exception as e:
                    log.warning("part_close_failed", part=type(closer).__name__, error=repr(e))

    def tick(self, r: "Runner", now: float) -> None:
        self._verify_new_checkpoint(r)
        if self.validator is not None and r.job is not None:
            self._validation_result(r, self.validator.poll(now))
        if now - self._last_status >= 0.25:
            self._last_status = now
            st = r.refresh_status_cache()
            if self.metrics is not None:
                try:
                    self.metrics.update(st)
                except Exception as e:
                    log.warning("metrics_update_failed", error=repr(e))
            if self.notifier is not None:
                line = _status_line(st)
                if line != self._status_line:
                    self._status_line = line
                    self.notifier.status(line)
        if self.notifier is not None:
            self.notifier.watchdog()

    def reloading(self, r: "Runner") -> None:
        if self.notifier is not None:
            self.notifier.reloading()

    def reloaded(self, r: "Runner") -> None:
        if self.notifier is not None:
            self.notifier.ready()

    def extend_timeout(self, seconds: float) -> None:
        if self.notifier is not None:
            self.notifier.extend_timeout(seconds)

    # -- per attempt ----------------------------------------------------------------------
    def gate(self, r: "Runner", previous_pids: Sequence[int]) -> dict[str, Any] | None:
        if self.launch_gate is None:
            return None
        verdict = self.launch_gate.check(previous_pids).to_dict()
        level = "info" if verdict.get("passed") else "error"
        r._event("health_gate", level, f"pre-launch health gate: {verdict.get('summary')}", ledger_only=True,
                 passed=verdict.get("passed"), waited_s=verdict.get("waited_s"))
        return verdict

    def choose_checkpoint(self, r: "Runner", action: Action, onset: int | None, explicit: str | None) -> "Resume":
        """Runs on the launch-preparation thread: verify, quarantine, choose (seconds)."""
        from .runner import Resume

        if explicit:
            return Resume(explicit, None, "the operator's choice (restart --from)")
        if self.ckpt is None:
            return Resume(None, None, "no checkpoint dir configured")
        from .checkpoints.quicklist import metrics_from_records

        svc = self.ckpt
        svc.set_writer_active(False)  # the previous attempt's group is gone
        svc.preserve_single_checkpoints()
        choice = svc.choose_for_resume(action, onset, metrics_from_records(list(r.metric_history)))
        for q in getattr(svc, "last_quarantined", ()) or ():
            r._event("checkpoint_quarantined", "warning",  # the service logged it; keep it in the ledger
                     f"checkpoint {q.source} is bad ({q.reason}); moved to {q.dest} (never deleted)",
                     ledger_only=True, source=str(q.source), dest=str(q.dest), reason=q.reason)
        self._newest_at_launch = _cand_key(self._newest_now())
        if choice is None:
            has_any = bool(svc.scan())
            return Resume(None, None, "no ready checkpoint: " + ("every candidate failed the quicklist"
                                                                 if has_any else "none written yet"))
        rd = choice.readiness.to_json() if choice.readiness is not None else None
        r._event("checkpoint_chosen", "info", ledger_only=True, message=
                 f"resuming from {choice.path} (step {choice.step}): {choice.reason}"
                 + (f"; passed over {len(choice.skipped)} newer" if choice.skipped else ""),
                 path=str(choice.path), step=choice.step, skipped=[list(x) for x in choice.skipped] or None,
                 readiness=rd)
        return Resume(str(choice.path), choice.step, choice.reason)

    def snapshot_extra(self, r: "Runner") -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, mon in (("gpu", self.gpu_mon), ("host", self.host_mon)):
            if mon is not None:
                try:
                    out[key] = mon.snapshot()
                except Exception as e:
                    out[key] = {"error": repr(e)}
        return out

    def before_spawn(self, r: "Runner") -> None:
        """Detectors start afresh for the new attempt before its first line can arrive."""
        if self.logwatch is not None:
            self.logwatch.reset(r.attempt, r.resume.step if r.resume.checkpoint else None)

    def job_env(self, r: "Runner") -> dict[str, str]:
        from .watch.heartbeat import client_env

        return client_env(r.cfg.heartbeat)

    def monitors_for_attempt(self, r: "Runner", ctx: AttemptContext) -> list[Monitor]:
        mons: list[Monitor] = [m for m in (self.heartbeat, self.tailer) if m is not None]
        mons += [m for m in (self.gpu_mon, self.host_mon) if m is not None]
        return mons

    def attempt_started(self, r: "Runner", ctx: AttemptContext) -> None:
        if self.ckpt is not None:
            self.ckpt.set_writer_active(True)
        self.tracks[ctx.attempt] = _Track(r.attempt_started_wall, r.resume.step if r.resume.checkpoint else None)
        self.validator = None
        if r.resume.checkpoint and r.cfg.validation.enabled:
            from .validation import Baseline, Validator

            startups = [t.startup() for a, t in self.tracks.items() if a != ctx.attempt and t.startup() is not None]
            baseline = Baseline.from_history(list(r.metric_history), r.resume.step, startups)  # type: ignore[arg-type]
            self.validator = Validator(r.cfg.validation, baseline, r.resume.step, ctx.started_monotonic)
            r._event("validation_started", "info",
                     f"validating the first {r.cfg.validation.steps} steps after resuming from step {r.resume.step}"
                     + (f" (reference loss {baseline.loss_at_resume:.4g})" if baseline.loss_at_resume is not None
                        else " (no loss recorded at that step: loss check skipped)"),
                     reference_loss=baseline.loss_at_resume, grad_norm_p99=baseline.grad_norm_p99,
                     throughput_median=baseline.throughput_median)
        if self.notifier is not None and ctx.attempt >= 0:
            self.notifier.ready()

    def on_metrics(self, r: "Runner", batch: list[MetricRecord]) -> None:
        track = self.tracks.get(r.attempt)
        if track is not None:
            for m in batch:
                if m.step is not None:
                    track.add(m.at, m.step)
        if self.validator is not None:
            self._validation_result(r, self.validator.feed(batch, r.clock.monotonic()))

    def _validation_result(self, r: "Runner", verdict: Any) -> None:
        if verdict is None:
            return
        from .events import Detection

        js = verdict.to_json()
        self.last_validation = js
        r.ledger.update_attempt(r.run_id, r.attempt, validation_json=js)
        if verdict.passed:
            r._event("validation_passed", "info", f"post-reboot validation {verdict.summary}", checks=js["checks"])
        else:
            r._event("validation_failed", "warning", f"post-reboot validation {verdict.summary}; the resumed "
                     "state is suspect", checks=js["checks"])
            r.emit(Detection(Cause.VALIDATION_FAILED, f"post-reboot validation {verdict.summary}", "validation",
                             step=max(self.validator.seen) if self.validator and self.validator.seen else None,
                             onset_step=verdict.resume_step, details=js))

    def dump_stacks(self, r: "Runner", pids: Sequence[int]) -> None:
        """Before a hung job is killed: every process's Python stack, into the state dir."""
        hb = r.cfg.heartbeat
        if not hb.dump_stacks or not pids:
            return
        from .watch.stacks import dump_stacks

        path = dump_stacks(pids, r.state_dir / "stacks", native=hb.dump_stacks_native,
                           timeout_s=hb.dump_stacks_timeout_s, label=f"attempt{r.attempt}-hang")
        if path is not None:
            r._event("stacks_dumped", "warning", f"saved the Python stacks of the hung job ({len(pids)} "
                     f"processes) to {path} before stopping it", path=str(path))
        else:
            r._event("stacks_unavailable", "warning", "py-spy is not installed: no stack dump of the hung job "
                     "(pip install 'transformer-supervisor[diagnostics]')", ledger_only=True)

    def new_checkpoint_probe(self, r: "Runner", now: float) -> Callable[[], bool] | None:
        if self.ckpt is None:  # no checkpoint dir configured: nothing to wait for
            return None
        before = _cand_key(self._newest_now())

        def probe() -> bool:
            # A new complete checkpoint (not a temp file, settled) is the emergency one.
            key = _cand_key(self._newest_now())
            return key is not None and key != before

        return probe

    def attempt_ended(self, r: "Runner", cause: Cause | None, decision: "Decision | None") -> None:
        track = self.tracks.get(r.attempt)
        if track is not None:
            track.ended_at = r.clock.time()
            track.cause = cause.value if cause else None
        self._goodput_at = float("-inf")
        if self.validator is not None and self.validator.verdict is None:
            inc = self.validator.incomplete()
            r.ledger.update_attempt(r.run_id, r.attempt, validation_json=inc)
            self.last_validation = inc
        self.validator = None
        if self.ckpt is None or cause is None or cause is Cause.MANUAL:
            return
        # Only noted here: the service's bookkeeping takes its lock, which a background load test
        # may hold for seconds, so it happens on the launch-preparation thread (before_launch).
        self.ckpt.set_writer_active(False)  # the attempt's group is gone: nothing still writes
        newer = _cand_key(self._newest_now()) != self._newest_at_launch
        self._ended = (r.resume.checkpoint, cause.value, newer, r.resume.step)

    def before_launch(self, r: "Runner") -> str | None:
        """On the preparation thread: book the last attempt's result against its checkpoint
        (a checkpoint failed from twice is marked bad); a reason to give up on no progress."""
        ended, self._ended = self._ended, None
        if self.ckpt is None or ended is None:
            return None
        ckpt, cause, newer, step = ended
        if self.ckpt.note_attempt_result(ckpt, cause, newer, step=step):
            r._event("checkpoint_marked_bad", "warning",
                     f"checkpoint {ckpt} is marked bad: the job failed from it ({cause}) without producing a "
                     "newer one; the next resume uses an older ready checkpoint", path=ckpt, cause=cause)
        if not self.ckpt.no_progress():
            return None
        return (f"no progress: {self.ckpt.attempts_without_progress()} attempts in a row failed without a newer "
                f"checkpoint (steps resumed from: {self.ckpt.steps_seen()}; "
                f"checkpoints.no_progress_attempts = {r.cfg.checkpoints.no_progress_attempts})")

    def _verify_new_checkpoint(self, r: "Runner") -> None:
        """A checkpoint that appeared while the job runs is verified on a thread of its own."""
        if self.ckpt is None or not r.cfg.checkpoints.verify_in_background or r.job is None:
            return
        newest = self._newest()
        key = _cand_key(newest)
        if key is None or key == self._verified_key or (self._verifier and self._verifier.is_alive()):
            return
        self._verified_key = key
        svc = self.ckpt

        def verify() -> None:
            try:
                row = svc.verify_newest()
            except Exception as e:
                log.warning("checkpoint_background_verify_failed", error=repr(e))
                return
            if row is not None and not row.ready:
                log.warning("checkpoint_not_ready", path=str(row.path), reasons=list(row.reasons),
                            message=f"the newest checkpoint {row.path} fails the readiness quicklist: "
                                    f"{'; '.join(row.reasons)}; a restart would use an older one")

        self._verifier = threading.Thread(target=verify, name="checkpoint-verify", daemon=True)
        self._verifier.start()

    def _newest_now(self) -> Any:
        """The newest complete checkpoint by a fresh discovery scan (never the service's lock)."""
        if self.ckpt is None:
            return None
        from .checkpoints.discovery import Layout

        cands = [c for c in self.ckpt.discovery.scan() if c.layout is not Layout.LAST_GOOD]
        return cands[0] if cands else None

    def _newest(self) -> Any:
        """The newest complete checkpoint from a plain discovery scan (its own short lock, never
        the service's, which a load test on the preparation thread may hold for seconds), at most
        every 5 s. Read by status and by the host monitor's disk check."""
        if self.ckpt is None:
            return None
        now = time.monotonic()
        if now - self._newest_at >= 5.0:
            self._newest_at = now
            self._newest_cache = self._newest_now()
        return self._newest_cache

    def goodput(self, r: "Runner") -> dict[str, Any] | None:
        from .goodput import AttemptTimeline, compute

        now = r.clock.monotonic()
        if now - self._goodput_at < 5.0 and self._goodput is not None:
            return self._goodput
        self._goodput_at = now
        tls = [AttemptTimeline(a, t.started_at, t.ended_at, t.cause, t.resume_step, t.points())
               for a, t in sorted(self.tracks.items())]
        self._goodput = compute(tls, r.clock.time()).to_json() if tls else None
        return self._goodput

    def status_extra(self, r: "Runner") -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.heartbeat is not None:
            out["heartbeats"] = {str(k): round(v, 3) for k, v in self.heartbeat.heartbeats().items()}
        gp = self.goodput(r)
        out["goodput"] = gp["ratio"] if gp else None
        newest = self._newest()
        if newest is not None:
            out["newest_checkpoint"] = str(newest.path)
            out["seconds_since_last_good_checkpoint"] = round(max(0.0, time.time() - newest.mtime), 1)
        out["goodput_detail"] = gp
        out["validation"] = self.last_validation
        if self.gpu_mon is not None:
            out["gpus"] = self.gpu_mon.gpus()
        return out


class _Track:
    """One attempt's progress for goodput: (wall time, step) points, at most one per 5 s plus the
    latest, so a week-long run costs kilobytes, not the whole metric stream."""

    def __init__(self, started_at: float, resume_step: int | None) -> None:
        self.started_at = started_at
        self.resume_step = resume_step
        self.ended_at: float | None = None
        self.cause: str | None = None
        self._pts: list[tuple[float, int]] = []
        self._last: tuple[float, int] | None = None

    def add(self, t: float, step: int) -> None:
        if not self._pts or t - self._pts[-1][0] >= 5.0 or step < self._pts[-1][1]:
            self._pts.append((t, step))
            self._last = None
        else:
            self._last = (t, step)

    def points(self) -> list[tuple[float, int]]:
        return self._pts + ([self._last] if self._last else [])

    def startup(self) -> float | None:
        return self._pts[0][0] - self.started_at if self._pts else None


def _cand_key(c: Any) -> Any:
    return None if c is None else (str(c.path), c.mtime, c.size)


def _remedy_keys(cfg: Any) -> list[str]:
    """Launch-arg keys that remedies change: the checkpoint config diff allows them."""
    keys: list[str] = []
    for oc in cfg.on.values():
        for rem in oc.remedies:
            for a in rem.args:
                if a.startswith("-"):
                    keys.append(a.split("=", 1)[0].lstrip("-"))
            keys += list(rem.env)
    return keys


def _status_line(st: dict[str, Any]) -> str:
    lm = st.get("last_metric") or {}
    parts = [f"{st.get('state')}", f"attempt {st.get('attempt')}"]
    if lm.get("step") is not None:
        parts.append(f"step {lm['step']}")
    if lm.get("loss") is not None:
        parts.append(f"loss {lm['loss']:.4g}")
    return ", ".join(parts)


def build_parts(r: "Runner") -> Parts:
    return Parts()
