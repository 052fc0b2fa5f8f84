"""The daemon's last wait: its metrics listener stays up after the end until Prometheus has
scraped the final state (:mod:`supervisor.ops.scrapes`), so a give-up fires ``TsupGaveUp`` from
the listener and a finish or stop is known to the rules as an end, not a crash
(``TsupDaemonDown`` stays quiet). SIGINT or SIGTERM during the wait ends it at once."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator

import structlog

from .ports import Notifier

if TYPE_CHECKING:
    from ..ops.metrics import Metrics

log = structlog.get_logger("supervisor.daemon")


@contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGINT/SIGTERM set ``stop`` (and still reach the handler before, which only queues them)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {}

    def handler(signum: int, frame: Any) -> None:
        stop.set()
        before = previous.get(signum)
        if callable(before):
            before(signum, frame)

    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for signum, before in previous.items():
            signal.signal(signum, before)


def linger(metrics: Metrics, notifier: Notifier) -> None:
    """Wait (bounded by ``[metrics] linger_s``) for the scrapers to fetch the final state; say
    why the daemon is still up, and who did not come back."""
    status, since = metrics.published()
    waiting = metrics.scrapes.waiting(since)
    limit = metrics.config.linger_s
    if metrics.address is None or limit <= 0 or not waiting:
        return
    host, port = metrics.address
    state = status.get("phase") or status.get("state")
    log.info("metrics_linger", state=state, scrapers=waiting, limit_s=limit,
             message=f"the run ended ({state}); the metrics listener on {host}:{port} stays up until "
                     f"{', '.join(waiting)} scraped the final state, at most {limit:g} s, then the daemon exits "
                     "(Ctrl-C or SIGTERM ends the wait now)")
    notifier.extend_timeout(limit + 10)  # systemd's stop timeout must not kill the wait
    notifier.status(f"{state}; waiting up to {limit:g} s for Prometheus to scrape the final state")
    stop = threading.Event()

    def keepalive() -> None:
        notifier.watchdog()  # STOPPING=1 went out before: systemd may not watch any more, a ping is harmless

    with _stop_on_signals(stop):
        waited, left = metrics.linger(stop, keepalive=keepalive)
    if left:
        log.info("metrics_linger_ended", state=state, waited_s=round(waited, 3), not_scraped_by=left,
                 message=f"{', '.join(left)} did not scrape the final state within {waited:.1f} s"
                         + (" (the wait was interrupted)" if stop.is_set() else "")
                         + "; exiting now: the rules see the listener gone without its end")
