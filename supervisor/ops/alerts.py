"""Tell a human: the ``[notify]`` hook command and webhook, sent off the main loop.

:class:`Alerter` takes :class:`~supervisor.ops.alertmsg.Alert` s from any thread (``submit``
never blocks: the rate limit, then a bounded queue per sink; a full queue drops and counts).
Each sink (the command, the webhook) has a worker thread of its own, so a dead webhook never
delays the hook command, and neither ever delays supervision. A send that fails is tried
``retries`` more times with backoff; a sink's failures are logged once per episode (the first
failure, then its recovery), with what happens next. Each try has one total deadline
(:mod:`.delivery`: a webhook that trickles its reply, a hook that never exits, end on time).
The give-up notice goes first among those waiting and is never the one a full queue drops.
``close`` waits a bounded time for what is still being sent (a try of an earlier notice yields to
a waiting give-up notice halfway), then cuts the try still running: a hook command still running
at the daemon's exit is killed with its process group, never left behind.

Not the systemd notification protocol: that is :mod:`supervisor.ops.notify`.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import threading
import time
from typing import Callable

import structlog

from ..redact import redact_argv, redact_url
from .alertmsg import GAVE_UP, Alert, Masker, RateLimit
from .config import NotifyConfig
from .delivery import PermanentError, Redirected, Try, post_webhook, run_hook

log = structlog.get_logger("supervisor.ops.alerts")

QUEUE_SIZE = 32
BACKOFF_FIRST_S = 1.0
#: At exit, how long past the close a try of an earlier notice may hold up a waiting give-up
#: notice before it is cut (as a share of ``shutdown_wait_s``): the give-up notice is the last word.
YIELD_SHARE = 0.5
#: At exit, how long a sink's thread gets to end once its try was cut (the hook reaped).
CUT_JOIN_S = 1.0

__all__ = ["Alerter", "PermanentError", "Sink"]


class Sink:
    """One way of telling (``command`` or ``webhook``): its queue, its thread, its failure episode."""

    def __init__(self, name: str, send: Callable[[bytes, dict[str, str], Try], None], cfg: NotifyConfig,
                 masker: Masker) -> None:
        self.name = name
        self.send = send
        self.cfg = cfg
        self.masker = masker
        # The give-up notice first among those waiting: a backlog must not hold up the last word.
        # Unbounded as a queue; put() keeps the bound for every other notice.
        self.q: queue.PriorityQueue[tuple[int, int, Alert]] = queue.PriorityQueue()
        self._seq = itertools.count()
        self.current: tuple[Alert, Try] | None = None  # the try running now (close may cut it)
        self.deadline: float | None = None  # set by close: nothing is tried past it
        self.closing = threading.Event()
        self.unfinished = 0  # queued or being sent: counted from put to the end of its delivery
        self.finals_waiting = 0  # give-up notices queued (they go first; at exit the others yield to them)
        self._count_lock = threading.Lock()  # put() runs on any thread, the decrements on the worker
        self.failing = 0  # failed notifications in the current episode (0: working)
        self.sent = self.failed = self.dropped = 0
        self._dropping = False
        self.thread = threading.Thread(target=self._run, name=f"notify-{name}", daemon=True)

    def put(self, alert: Alert) -> None:
        final = alert.event == GAVE_UP
        if final or self.q.qsize() < QUEUE_SIZE:  # gave_up happens once: it is never the one dropped
            with self._count_lock:
                self.unfinished += 1
                self.finals_waiting += final
            self.q.put_nowait((0 if final else 1, next(self._seq), alert))
            if self._dropping:
                self._dropping = False
                log.info("notify_queue_recovered", sink=self.name, dropped=self.dropped,
                         next="notifications are queued again")
        else:
            self.dropped += 1
            if not self._dropping:  # once per episode: a restart loop must not flood the log either
                self._dropping = True
                log.warning("notify_dropped", sink=self.name, notify_event=alert.event, dropped=self.dropped,
                            message=f"{QUEUE_SIZE} notifications are already waiting for the {self.name}",
                            next="dropping new ones (counted) until the queue has room")

    def pending(self) -> int:
        return self.unfinished

    @property
    def busy(self) -> bool:
        """A try is under way now."""
        return self.current is not None

    def _run(self) -> None:
        while True:
            try:
                prio, _seq, alert = self.q.get(timeout=0.1)
            except queue.Empty:
                if self.closing.is_set():
                    return
                continue
            if prio == 0:
                with self._count_lock:
                    self.finals_waiting -= 1
            try:
                self._deliver(alert)
            except Exception as e:  # a bug here must not end the thread: later notices still go out
                log.exception("notify_internal_error", sink=self.name, error=repr(e),
                              next="this notification is lost; later ones are still sent")
            finally:
                with self._count_lock:
                    self.unfinished -= 1

    def yield_at(self, at: float) -> None:
        """At exit: a give-up notice is waiting behind a try of an earlier notice, which gets until
        ``at`` (monotonic) before it is cut, so the give-up notice has the rest of the wait."""
        current = self.current
        if current is None or not self.finals_waiting or current[0].event == GAVE_UP:
            return
        timer = threading.Timer(max(0.0, at - time.monotonic()), current[1].cut,
                                args=("cut at the daemon's exit so that the give-up notice could go out",))
        timer.daemon = True
        timer.start()

    def cut_current(self) -> bool:
        """At exit, past the wait: cut the try still running (a hook is killed with its process
        group, a webhook's socket shut down). True when there was one."""
        current = self.current
        if current is None:
            return False
        current[1].cut("cut at the daemon's exit ([notify] shutdown_wait_s)")
        return True

    def _left(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.monotonic()

    def _deliver(self, alert: Alert) -> None:
        payload = alert.payload(self.masker)
        body = json.dumps(payload, allow_nan=False).encode()
        env = alert.env(self.masker)
        error, tries, delay = "", 0, BACKOFF_FIRST_S
        for tries in range(1, self.cfg.retries + 2):
            timeout = min(self.cfg.timeout_s, self._left())
            if timeout <= 0:
                error = error or "no time left before the daemon exits"
                break
            attempt = Try(timeout)
            self.current = (alert, attempt)
            try:
                self.send(body, env, attempt)
            except Redirected as e:
                error = self.masker.text(str(e))
                log.warning("notify_redirect_refused", sink=self.name, notify_event=alert.event, status=e.status,
                            to_host=e.to_host, message=f"the webhook answered HTTP {e.status} (a redirect)",
                            next="this notice was not delivered; set webhook_url to the address the redirect "
                                 "names (redirects are never followed)")
                break
            except PermanentError as e:
                error = self.masker.text(str(e))
                break
            except Exception as e:
                error = self.masker.text(f"{type(e).__name__}: {e}")
                if self.deadline is not None and (attempt.cut_reason is not None or self.finals_waiting):
                    break  # at the daemon's exit: no second try past a cut, nor before the give-up notice
                if tries <= self.cfg.retries:
                    # The backoff on the worker's own thread, cut short by the exit (close sets closing).
                    self.closing.wait(max(0.0, min(delay, self._left())))
                    delay *= 2
                continue
            finally:
                self.current = None
            self.sent += 1
            if self.failing:
                log.info("notify_recovered", sink=self.name, notify_event=alert.event, failed=self.failing,
                         message=f"the {self.name} works again after {self.failing} failed notification(s)")
                self.failing = 0
            return
        self.failed += 1
        self.failing += 1
        if self.failing == 1:
            log.warning("notify_failed", sink=self.name, notify_event=alert.event, tries=tries, error=error,
                        next=("the daemon exits without this notice" if self.deadline is not None else
                              "this notice is lost; later ones are still tried (this is logged once "
                              "until the " + self.name + " works again)"))


class Alerter:
    """The configured sinks behind one rate limit; ``submit`` from any thread."""

    def __init__(self, cfg: NotifyConfig, masker: Masker, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.monotonic = monotonic
        self.rate = RateLimit(cfg.repeat_after_s, cfg.max_per_hour)
        self.held = 0
        self._lock = threading.Lock()
        self.sinks: list[Sink] = []
        if cfg.command:
            self.sinks.append(Sink("command", self._run_command, cfg, masker))
        if cfg.webhook_url:
            self.sinks.append(Sink("webhook", self._post, cfg, masker))

    def start(self) -> None:
        for s in self.sinks:
            s.thread.start()
        # Its argv as the job's is shown (``-u user:pw``, ``--api-key x`` masked): the gate at the sink
        # reads each argument alone, so a secret after its flag would pass it.
        log.info("notify_ready", command=redact_argv(self.cfg.command) or None,
                 webhook=redact_url(self.cfg.webhook_url) if self.cfg.webhook_url else None,
                 events=list(self.cfg.events), next="these events are sent as they happen")

    def submit(self, alert: Alert) -> bool:
        """Queue ``alert`` for every sink unless the rate limit holds it back. Never blocks long."""
        with self._lock:
            held_before = self.rate.admit(alert.event, self.monotonic())
            if held_before is None:
                self.held += 1
                log.info("notify_held_back", notify_event=alert.event,
                         next=f"counted; said in the next {alert.event} notice ([notify] repeat_after_s, max_per_hour)")
                return False
        if held_before:
            alert = Alert(**{**alert.__dict__, "suppressed": held_before})
        for s in self.sinks:
            s.put(alert)
        return True

    def close(self, wait_s: float) -> None:
        """Wait at most ``wait_s`` for what is queued or being sent, then leave it."""
        now = time.monotonic()
        deadline = now + wait_s
        for s in self.sinks:
            s.deadline = deadline
            s.closing.set()
            s.yield_at(now + wait_s * YIELD_SHARE)
        for s in self.sinks:
            s.thread.join(timeout=max(0.0, deadline - time.monotonic()))
        left = {s.name: s.pending() for s in self.sinks if s.thread.is_alive()}
        # A hook still running now would outlive the daemon with whatever it started: killed with
        # its process group (a webhook try: its socket shut), then its thread gets a moment to reap it.
        cut = [s.name for s in self.sinks if s.thread.is_alive() and s.cut_current()]
        for s in self.sinks:
            if s.name in cut:
                s.thread.join(timeout=CUT_JOIN_S)
        if left:
            log.warning("notify_abandoned", pending=left, cut=cut,
                        message=f"notifications still unsent after {wait_s:g} s ([notify] shutdown_wait_s)",
                        next="the daemon exits without them" + ("; the try still running was cut (a hook "
                                                                "command killed with its process group)" if cut else ""))

    def counts(self) -> dict[str, dict[str, int]]:
        return {s.name: {"sent": s.sent, "failed": s.failed, "dropped": s.dropped} for s in self.sinks}

    # ------------------------------------------------------------------ the two ways to send
    def _run_command(self, body: bytes, env: dict[str, str], attempt: Try) -> None:
        run_hook(self.cfg.command, body, {**os.environ, **env}, attempt)

    def _post(self, body: bytes, _env: dict[str, str], attempt: Try) -> None:
        assert self.cfg.webhook_url
        post_webhook(self.cfg.webhook_url, body, attempt)
