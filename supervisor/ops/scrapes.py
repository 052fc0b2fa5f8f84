"""Who scrapes the metrics listener, and the wait at the end until they have seen the end.

A daemon that exits right after its give-up is gone before Prometheus scrapes again: the
``gave_up`` state (and a finish's ``finished``, which tells the shipped rules that a target
down afterwards is no daemon crash) never reaches it. So the listener notes when each address
fetched ``/metrics``, and at the end :func:`wait_for_scrapers` waits until every address that
was scraping regularly has fetched once after the final state was published, at most
``linger_s``. A one-off ``curl`` (one fetch) is no scraper; a scraper that misses twice its own
interval has stopped (a test's polling loop, a Prometheus gone) and is not waited for.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

#: Addresses remembered at most (the oldest forgotten first): the listener is open to whatever
#: can reach it, a scan from many addresses must not grow the daemon.
MAX_SCRAPERS = 16
#: A scraper late by more than twice its interval plus this is taken as gone (the slack: a loaded
#: node or Prometheus delays a scrape of a 1 s interval by seconds, not one of 15 s by minutes).
LATE_SLACK_S = 5.0


@dataclass
class _Scraper:
    first: float
    last: float
    count: int = 1

    def interval(self) -> float | None:
        return (self.last - self.first) / (self.count - 1) if self.count > 1 else None


class ScrapeLog:
    """Scrape times by remote address (thread-safe: the HTTP threads note, the main loop asks)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._by_addr: dict[str, _Scraper] = {}

    def note(self, addr: str) -> None:
        """One fetch of ``/metrics`` starting now (before the exposition is rendered: a fetch
        noted at or after the final publish saw the final state)."""
        now = self._clock()
        with self._lock:
            s = self._by_addr.pop(addr, None)  # re-inserted: the dict's order is the recency
            if s is None:
                s = _Scraper(now, now)
                if len(self._by_addr) >= MAX_SCRAPERS:
                    del self._by_addr[next(iter(self._by_addr))]
            else:
                s.last, s.count = now, s.count + 1
            self._by_addr[addr] = s

    def waiting(self, since: float, now: float | None = None) -> list[str]:
        """The regular scrapers that have not fetched since ``since`` and are not overdue."""
        now = self._clock() if now is None else now
        with self._lock:
            out = []
            for addr, s in self._by_addr.items():
                interval = s.interval()
                if interval is None or s.last >= since:
                    continue
                if now <= s.last + 2 * interval + LATE_SLACK_S:
                    out.append(addr)
            return out


def wait_for_scrapers(log: ScrapeLog, since: float, limit_s: float, stop: threading.Event,
                      keepalive: Callable[[], None] = lambda: None, poll_s: float = 0.1) -> tuple[bool, list[str]]:
    """Wait until no scraper waits for the state published at ``since`` (wall time), at most
    ``limit_s``, or until ``stop`` is set; ``keepalive`` is called meanwhile (systemd). Returns
    (all seen, the addresses still waited for)."""
    deadline = time.monotonic() + limit_s
    while True:
        left = log.waiting(since)
        if not left:
            return True, []
        if stop.is_set() or time.monotonic() >= deadline:
            return False, left
        keepalive()
        stop.wait(poll_s)
