"""Tell a human: the ``[notify]`` hook command and webhook, sent off the main loop.

:class:`Alerter` takes :class:`~supervisor.ops.alertmsg.Alert` s from any thread (``submit``
never blocks: the rate limit, then a bounded queue per sink; a full queue drops and counts).
Each sink (the command, the webhook) has a worker thread of its own, so a dead webhook never
delays the hook command, and neither ever delays supervision. A send that fails is tried
``retries`` more times with backoff; a sink's failures are logged once per episode (the first
failure, then its recovery), with what happens next. ``close`` waits a bounded time for what is
still being sent: the give-up notice goes out before the daemon exits.

Not the systemd notification protocol: that is :mod:`supervisor.ops.notify`.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
from typing import Callable

import structlog

from ..redact import redact_url
from .alertmsg import Alert, Masker, RateLimit
from .config import NotifyConfig

log = structlog.get_logger("supervisor.ops.alerts")

QUEUE_SIZE = 32
BACKOFF_FIRST_S = 1.0


class PermanentError(Exception):
    """A failure another try would repeat (a 4xx answer, a hook command that does not exist)."""


class Sink:
    """One way of telling (``command`` or ``webhook``): its queue, its thread, its failure episode."""

    def __init__(self, name: str, send: Callable[[bytes, dict[str, str], float], None], cfg: NotifyConfig,
                 masker: Masker) -> None:
        self.name = name
        self.send = send
        self.cfg = cfg
        self.masker = masker
        self.q: queue.Queue[Alert] = queue.Queue(maxsize=QUEUE_SIZE)
        self.deadline: float | None = None  # set by close: nothing is tried past it
        self.closing = threading.Event()
        self.busy = False
        self.failing = 0  # failed notifications in the current episode (0: working)
        self.sent = self.failed = self.dropped = 0
        self._dropping = False
        self.thread = threading.Thread(target=self._run, name=f"notify-{name}", daemon=True)

    def put(self, alert: Alert) -> None:
        try:
            self.q.put_nowait(alert)
            if self._dropping:
                self._dropping = False
                log.info("notify_queue_recovered", sink=self.name, dropped=self.dropped,
                         next="notifications are queued again")
        except queue.Full:
            self.dropped += 1
            if not self._dropping:  # once per episode: a restart loop must not flood the log either
                self._dropping = True
                log.warning("notify_dropped", sink=self.name, notify_event=alert.event, dropped=self.dropped,
                            message=f"{QUEUE_SIZE} notifications are already waiting for the {self.name}",
                            next="dropping new ones (counted) until the queue has room")

    def pending(self) -> int:
        return self.q.qsize() + (1 if self.busy else 0)

    def _run(self) -> None:
        while True:
            try:
                alert = self.q.get(timeout=0.1)
            except queue.Empty:
                if self.closing.is_set():
                    return
                continue
            self.busy = True
            try:
                self._deliver(alert)
            except Exception as e:  # a bug here must not end the thread: later notices still go out
                log.exception("notify_internal_error", sink=self.name, error=repr(e),
                              next="this notification is lost; later ones are still sent")
            finally:
                self.busy = False

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
            try:
                self.send(body, env, timeout)
            except PermanentError as e:
                error = self.masker.text(str(e))
                break
            except Exception as e:
                error = self.masker.text(f"{type(e).__name__}: {e}")
                if tries <= self.cfg.retries:
                    # The backoff, cut short by the exit deadline (the worker's own thread waits, not the loop).
                    time.sleep(max(0.0, min(delay, self._left())))
                    delay *= 2
                continue
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
        log.info("notify_ready", command=list(self.cfg.command) or None,
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
        deadline = time.monotonic() + wait_s
        for s in self.sinks:
            s.deadline = deadline
            s.closing.set()
        for s in self.sinks:
            s.thread.join(timeout=max(0.0, deadline - time.monotonic()))
        left = {s.name: s.pending() for s in self.sinks if s.thread.is_alive()}
        if left:
            log.warning("notify_abandoned", pending=left,
                        message=f"notifications still unsent after {wait_s:g} s ([notify] shutdown_wait_s)",
                        next="the daemon exits without them")

    def counts(self) -> dict[str, dict[str, int]]:
        return {s.name: {"sent": s.sent, "failed": s.failed, "dropped": s.dropped} for s in self.sinks}

    # ------------------------------------------------------------------ the two ways to send
    def _run_command(self, body: bytes, env: dict[str, str], timeout: float) -> None:
        """Exec the hook (never a shell: no quoting of event text can run anything) in a session
        of its own, so a hook that hangs is killed with whatever it started."""
        try:
            proc = subprocess.Popen(list(self.cfg.command), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, env={**os.environ, **env}, close_fds=True,
                                    start_new_session=True)
        except OSError as e:  # not found, not executable: another try would fail the same way
            raise PermanentError(f"cannot run {self.cfg.command[0]}: {e.strerror or e}") from e
        try:
            _out, err = proc.communicate(body, timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.communicate()
            raise TimeoutError(f"the hook command ran past {timeout:.3g} s and was killed") from None
        if proc.returncode != 0:
            tail = err.decode(errors="replace").strip()[-300:]
            raise RuntimeError(f"the hook command exited {proc.returncode}" + (f": {tail}" if tail else ""))

    def _post(self, body: bytes, _env: dict[str, str], timeout: float) -> None:
        """POST the JSON. urllib from the stdlib: one small POST does not justify a dependency
        (requests/httpx) in the daemon, and it honours the usual *_proxy variables."""
        import urllib.error
        import urllib.request

        assert self.cfg.webhook_url
        req = urllib.request.Request(self.cfg.webhook_url, data=body, method="POST", headers={
            "Content-Type": "application/json", "User-Agent": "transformer-supervisor"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                resp.read(4096)
        except urllib.error.HTTPError as e:
            # 4xx (a revoked hook, a bad URL) would fail again; 408/429 and 5xx may pass later.
            if 400 <= e.code < 500 and e.code not in (408, 429):
                raise PermanentError(f"the webhook answered HTTP {e.code} {e.reason}") from None
            raise RuntimeError(f"the webhook answered HTTP {e.code} {e.reason}") from None
        except urllib.error.URLError as e:
            raise ConnectionError(f"cannot reach the webhook: {e.reason}") from None
