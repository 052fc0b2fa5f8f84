"""The ``[notify]`` concern: the chosen daemon events, and ``restart_loop``, to a human.

It sees every event the daemon records (the runner's ``event``: log, journal, ledger, history)
as a ``Noted`` notice (``OnNotes``), picks the ones in ``[notify] events`` and hands them to
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
import time
from typing import TYPE_CHECKING, Any, Mapping

import structlog

from ..eventnames import EventName
from ..levels import Level
from .plugin import Closes, DaemonStarted, Effects, GivesStatus, Noted, OnNotes, OnStart, OnTicks, RunView, Tick

if TYPE_CHECKING:  # imported only when [notify] names a command or a webhook
    from ..config.model import Config
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


class NotifyPlugin(OnStart, OnTicks, OnNotes, GivesStatus, Closes):
    name = "notify"

    def __init__(self) -> None:
        self.cfg: Config | None = None  # the config in force, as of the last turn (a reload changes it)
        self.alerter: Alerter | None = None
        self.loop: RestartLoop | None = None
        self.events: frozenset[str] = frozenset()
        self.host = socket.gethostname()
        self._lock = threading.Lock()  # noted comes from any thread

    def started(self, n: DaemonStarted, run: RunView) -> Effects:
        nc = run.cfg.notify
        if not (nc.command or nc.webhook_url):
            return ()
        from ..ops.alertmsg import Masker
        from ..ops.alerts import Alerter

        self.cfg = run.cfg
        self.events = frozenset(nc.events)
        self.loop = RestartLoop(nc.restart_loop_count, nc.restart_loop_window_s)
        masker = Masker.of(run.cfg.job.env, dict(os.environ), extra=[nc.webhook_url])
        self.alerter = Alerter(nc, masker, monotonic=time.monotonic)
        self.alerter.start()
        return ()

    def tick(self, n: Tick, run: RunView) -> Effects:
        if self.alerter is not None:
            self.cfg = run.cfg
        return ()

    def noted(self, n: Noted) -> Effects:
        if self.alerter is None:
            return ()
        if n.event == EventName.RESTART_SCHEDULED and EventName.RESTART_LOOP in self.events:
            self._restart_loop(n)
        if n.event in self.events:
            self._send(n, n.event, n.level, n.message, n.data)
        return ()

    def _restart_loop(self, n: Noted) -> None:
        assert self.cfg is not None and self.loop is not None
        with self._lock:
            count = self.loop.restart(n.now)
        if count is not None:
            p = self.cfg.policy
            self._send(n, EventName.RESTART_LOOP, Level.ERROR,
                       f"{count} restarts within {self.loop.window_s:g} s ([notify] restart_loop_window_s); the latest: "
                       f"{n.message}. The daemon keeps restarting until policy.max_restarts ({p.max_restarts} in "
                       f"{p.restart_window_s:g} s) is spent, then gives up",
                       {"restarts": count, "window_s": self.loop.window_s, **dict(n.data)})

    def _send(self, n: Noted, event: str, level: Level, message: str, data: Mapping[str, Any]) -> None:
        from ..ops.alertmsg import Alert

        cfg, alerter = self.cfg, self.alerter
        assert cfg is not None and alerter is not None  # noted sends only once started with one
        alerter.submit(Alert(event, level, message, cfg.job.name, n.run_id, self.host, n.attempt, n.at, dict(data)))

    def status(self, run: RunView) -> Mapping[str, Any]:
        return {"notify": self.alerter.counts()} if self.alerter is not None else {}

    def close(self) -> None:
        if self.alerter is not None and self.cfg is not None:
            self.alerter.close(self.cfg.notify.shutdown_wait_s)
