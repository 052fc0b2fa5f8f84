"""The ``[notify]`` concern: the chosen daemon events, and ``restart_loop``, to a human.

It sees every event the daemon records (the runner's ``event``: log, journal, ledger, history)
through the ``on_event`` hook, picks the ones in ``[notify] events`` and hands them to
:class:`~supervisor.ops.alerts.Alerter`, which sends them on threads of its own. ``restart_loop``
is not an event of the daemon: it is said here when ``restart_loop_count`` restarts were
scheduled within ``restart_loop_window_s`` (the daemon keeps restarting while the policy's budget
lasts; a human may want to look before it gives up). At exit the concern waits at most
``shutdown_wait_s`` for what is still being sent, so the give-up notice leaves before the daemon.
Nothing is imported or started when ``[notify]`` names neither a command nor a webhook.
"""

from __future__ import annotations

import collections
import os
import socket
import threading
from typing import TYPE_CHECKING, Any, Mapping

import structlog

from ..eventnames import EventName
from .ports import Concern, DaemonView

if TYPE_CHECKING:  # imported only when [notify] names a command or a webhook
    from ..ops.alerts import Alerter

log = structlog.get_logger("supervisor.daemon.alerting")


class RestartLoop:
    """``count`` restarts scheduled within ``window_s``: once, then counting starts again."""

    def __init__(self, count: int, window_s: float) -> None:
        self.count = count
        self.window_s = window_s
        self._at: collections.deque[float] = collections.deque()

    def restart(self, now: float) -> int | None:
        """Note a restart at ``now``; the restarts in the window when they make a loop, else None."""
        self._at.append(now)
        while self._at and now - self._at[0] > self.window_s:
            self._at.popleft()
        if len(self._at) < self.count:
            return None
        n = len(self._at)
        self._at.clear()  # one notice per loop episode; the next takes `count` more restarts
        return n


class NotifyConcern(Concern):
    name = "notify"

    def __init__(self) -> None:
        self.daemon: DaemonView | None = None
        self.alerter: Alerter | None = None
        self.loop: RestartLoop | None = None
        self.events: frozenset[str] = frozenset()
        self.host = socket.gethostname()
        self._lock = threading.Lock()  # on_event comes from any thread

    def start(self, daemon: DaemonView) -> None:
        nc = daemon.cfg.notify
        if not (nc.command or nc.webhook_url):
            return
        from ..ops.alertmsg import Masker
        from ..ops.alerts import Alerter

        self.daemon = daemon
        self.events = frozenset(nc.events)
        self.loop = RestartLoop(nc.restart_loop_count, nc.restart_loop_window_s)
        masker = Masker.of(daemon.cfg.job.env, dict(os.environ), extra=[nc.webhook_url])
        self.alerter = Alerter(nc, masker, monotonic=daemon.clock.monotonic)
        self.alerter.start()

    def on_event(self, event: str, level: str, message: str, data: Mapping[str, Any]) -> None:
        if self.alerter is None:
            return
        if event == EventName.RESTART_SCHEDULED and EventName.RESTART_LOOP in self.events:
            self._restart_loop(message, data)
        if event in self.events:
            self._send(event, level, message, data)

    def _restart_loop(self, message: str, data: Mapping[str, Any]) -> None:
        assert self.daemon is not None and self.loop is not None
        with self._lock:
            n = self.loop.restart(self.daemon.clock.monotonic())
        if n is not None:
            p = self.daemon.cfg.policy
            self._send(EventName.RESTART_LOOP, "error",
                       f"{n} restarts within {self.loop.window_s:g} s ([notify] restart_loop_window_s); the latest: "
                       f"{message}. The daemon keeps restarting until policy.max_restarts ({p.max_restarts} in "
                       f"{p.restart_window_s:g} s) is spent, then gives up",
                       {"restarts": n, "window_s": self.loop.window_s, **dict(data)})

    def _send(self, event: str, level: str, message: str, data: Mapping[str, Any]) -> None:
        from ..ops.alertmsg import Alert

        d, alerter = self.daemon, self.alerter
        assert d is not None and alerter is not None  # on_event sends only once started with one
        attempt = d.attempt if d.attempt >= 0 else None
        alerter.submit(Alert(event, level, message, d.cfg.job.name, d.run_id, self.host, attempt,
                             d.clock.time(), dict(data)))

    def status(self) -> Mapping[str, Any]:
        return {"notify": self.alerter.counts()} if self.alerter is not None else {}

    def close(self) -> None:
        if self.alerter is not None and self.daemon is not None:
            self.alerter.close(self.daemon.cfg.notify.shutdown_wait_s)
