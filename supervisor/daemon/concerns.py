"""The operator's side of the daemon: the control socket, Prometheus, systemd status. The job's
output and heartbeats are :mod:`supervisor.daemon.watchconcern`, goodput and validation
:mod:`supervisor.daemon.progress`."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, Mapping

import structlog

from ..eventnames import EventName
from ..levels import Level
from .effects import Effect, Note
from .linger import linger
from .plugin import Closes, DaemonStarted, Effects, Noted, OnNotes, OnStart, OnTicks, RunView, Tick
from ..ops.control import ControlSocket
from .ports import Notifier

if TYPE_CHECKING:  # imported at start, only what is configured (prometheus_client: 12 ms)

    from ..checkpoints.service import CheckpointService
    from ..config.model import Config
    from ..ops.metrics import Metrics

log = structlog.get_logger("supervisor.daemon")

STATUS_EVERY_S = 0.25  # the status cache, the Prometheus gauges, systemd's STATUS= line


class OpsPlugin(OnStart, OnTicks, OnNotes, Closes):
    """The control socket, the Prometheus endpoint or textfile, systemd's status line. ``svc_of``:
    the checkpoint service that verifies a ``restart --from`` (None: no checkpoint dir)."""

    name = "ops"

    def __init__(self, notifier: Notifier, svc_of: Callable[[], CheckpointService | None] = lambda: None, *,
                 status_interval_s: float = 5.0, control: ControlSocket | None = None) -> None:
        self.notifier = notifier
        self.status_interval_s = status_interval_s  # systemd.status_interval_s: STATUS= at most this often
        self._status_sent_at = float("-inf")
        self.svc_of = svc_of
        self.control = control or ControlSocket()  # shared with the state-lock plug-in (it binds it again)
        self.metrics: Metrics | None = None
        self.refresh: Callable[[], Mapping[str, Any]] | None = None  # the status built now (on the loop)
        self.cfg: Config | None = None  # as of the last tick: a `restart --from` is checked against it
        self._last_status = float("-inf")
        self._status_line = ""
        self._loop_thread = threading.get_ident()

    def started(self, n: DaemonStarted, run: RunView) -> Effects:
        from .restartfrom import gate_restart_from

        self.refresh, self.cfg = n.refresh, run.cfg
        self._loop_thread = threading.get_ident()  # started on the main loop's thread
        self.control.bind(run.state_dir, gate_restart_from(n.control, lambda: self.cfg or run.cfg, run.state_dir,
                                                           self.svc_of))
        mc, name = run.cfg.metrics, run.cfg.job.name
        if not (mc.listen or mc.textfile):
            return ()
        from ..ops.metrics import Metrics  # prometheus_client: 12 ms of imports, only when asked for

        said: list[Effect] = []
        self.metrics = Metrics(mc, name=name)
        try:
            self.metrics.start()
        except OSError as e:  # a taken port must not stop the supervision of a training run
            said.append(Note(EventName.METRICS_UNAVAILABLE, Level.ERROR, f"cannot serve Prometheus metrics on "
                             f"{mc.listen}: {e}; supervising without the endpoint"))
        path = self.metrics.textfile_path()
        if path:
            from ..ops.textfiles import same_name_elsewhere

            others = same_name_elsewhere(path, name)
            if others:
                said.append(Note(EventName.METRICS_TEXTFILE_NAME_TAKEN, Level.WARNING,
                                 f"{', '.join(others)} beside this run's textfile {path} also export a run named "
                                 f"{name!r}: node_exporter rejects the series both repeat (neither run's state is "
                                 "collected); give this run its own [job] name, or delete the other file if its run "
                                 "is over", {"textfile": path, "others": others}))
        return said

    def tick(self, n: Tick, run: RunView) -> Effects:
        self.cfg = run.cfg
        if self.refresh is None or n.now - self._last_status < STATUS_EVERY_S:
            return ()
        self._last_status = now = n.now
        st = self.refresh()
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
        return ()

    def noted(self, n: Noted) -> Effects:
        # The give-up ends the loop: no tick publishes the gave_up state, and the daemon may stay
        # up a while (notify.shutdown_wait_s) with its listener answering. Publish it now, on the
        # loop's own thread only (events from other threads leave it to the next tick).
        if n.event == EventName.GAVE_UP and threading.get_ident() == self._loop_thread:
            self._publish_final()
        return ()

    def _publish_final(self) -> None:
        if self.metrics is not None and self.refresh is not None:
            try:  # the final state (stopped, gave_up) reaches the textfile before the daemon is gone
                self.metrics.final(self.refresh())
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
