"""The operator's side of the daemon: the control socket, Prometheus, systemd status. The job's
output and heartbeats are :mod:`supervisor.daemon.watchconcern`, goodput and validation
:mod:`supervisor.daemon.progress`."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Mapping

import structlog

from ..eventnames import EventName
from .linger import linger
from .ports import Concern, DaemonView, Notifier

if TYPE_CHECKING:  # imported at start, only what is configured (prometheus_client: 12 ms)
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
