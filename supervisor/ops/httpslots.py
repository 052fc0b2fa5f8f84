"""Who may hold a connection to one of the daemon's small HTTP listeners (the Prometheus listener,
the live page), and for how long: the one rule both keep (issue 34 part 3).

- at most ``max_connections`` at once. A new one past that makes the oldest connection still
  *reading* its request give way (its socket is shut down): a scrape or a page poll sends its
  request at once, so a crowd of slow clients never holds off a real one. When every connection
  is past its request (being answered), the new one is refused instead, and so it is while the
  threads of those that gave way, woken to end, are not gone yet: never more than twice
  ``max_connections`` serving threads;
- each connection ends ``deadline_s`` after it was accepted, whatever it is doing (``reap``, from
  the accepting thread's tick).

What was closed early is said at most once every ``said_every_s``, with the count since the last
time (the listener's own event name). Thread-safe; the server owns the sockets' threads, this
module only decides and shuts sockets down (which wakes the thread serving one).
"""
from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable

import structlog

log = structlog.get_logger("supervisor.ops")


@dataclass
class _Held:
    sock: socket.socket
    accepted: float
    reading: bool = True  # until its request line and headers are read


@dataclass(frozen=True)
class SlotWords:
    """How a listener names itself in its capped warning."""

    event: str  # e.g. "metrics_connections_capped"
    listener: str  # "the metrics listener"
    goes_on: str  # "scrapes go on"


class DeadlineSlots:
    def __init__(self, max_connections: int, deadline_s: float, words: SlotWords, *,
                 clock: Callable[[], float] = time.monotonic, said_every_s: float = 60.0) -> None:
        self.max_connections = max_connections
        self.deadline_s = deadline_s
        self.words = words
        self.clock = clock
        self.said_every_s = said_every_s
        self.closed_early = 0  # connections closed by a bound, since the start (tests, status)
        self._held: dict[socket.socket, _Held] = {}
        self._threads = 0  # serving threads alive, those given way included until they end
        self._lock = threading.Lock()
        self._unsaid = 0
        self._said_at: float | None = None

    def admit(self, sock: socket.socket) -> bool:
        """Whether ``sock`` may be served (the caller then starts its thread and, at its end,
        calls :meth:`release`); False: the caller closes it unanswered."""
        now = self.clock()
        with self._lock:
            self._reap(now)
            if len(self._held) >= self.max_connections:
                reading = [h for h in self._held.values() if h.reading]
                if not reading:  # every slot answering a request: this one waits for nothing
                    self._closed_early(now)
                    return False
                self._end(min(reading, key=lambda h: h.accepted))
                self._closed_early(now)
            if self._threads >= 2 * self.max_connections:  # those that gave way have not ended yet
                self._closed_early(now)
                return False
            self._held[sock] = _Held(sock, now)
            self._threads += 1
        sock.settimeout(self.deadline_s)  # no single read or write outlasts the whole deadline
        return True

    def request_read(self, sock: socket.socket) -> None:
        """Its request is read: from now on it is being answered and no longer gives way."""
        with self._lock:
            held = self._held.get(sock)
            if held is not None:
                held.reading = False

    def release(self, sock: socket.socket) -> None:
        """Its serving thread ends."""
        with self._lock:
            self._held.pop(sock, None)
            self._threads -= 1

    def reap(self) -> None:
        """Connections past their deadline are ended (the accepting thread's tick)."""
        now = self.clock()
        with self._lock:
            self._reap(now)

    def end_all(self) -> None:
        """The listener closes: every connection is ended (their threads wake and end)."""
        with self._lock:
            for held in list(self._held.values()):
                self._end(held)

    def connections(self) -> int:
        with self._lock:
            return len(self._held)

    # -- under the lock ------------------------------------------------------------------------------
    def _reap(self, now: float) -> None:
        for held in [h for h in self._held.values() if now - h.accepted >= self.deadline_s]:
            self._end(held)
            self._closed_early(now)

    def _end(self, held: _Held) -> None:
        """Shut the socket down (its thread wakes, finds the end and closes it) and forget it."""
        self._held.pop(held.sock, None)
        try:
            held.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed by its own thread

    def _closed_early(self, now: float) -> None:
        self.closed_early += 1
        self._unsaid += 1
        if self._said_at is None or now - self._said_at >= self.said_every_s:
            w = self.words
            log.warning(w.event, closed=self._unsaid, max_connections=self.max_connections,
                        deadline_s=self.deadline_s,
                        message=f"{w.listener} closed {self._unsaid} connection(s) early: more than "
                                f"{self.max_connections} at once (the oldest still sending its request gives way) "
                                f"or one lasting over {self.deadline_s:g} s; {w.goes_on}, and this is said at "
                                f"most once every {self.said_every_s:g} s")
            self._said_at, self._unsaid = now, 0


__all__ = ["DeadlineSlots", "SlotWords"]
