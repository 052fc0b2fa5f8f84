"""A warning that an outsider can repeat at will, said once per episode: the first at once, the
rest counted, and the count said when the episode ends (``window_s`` without a repeat).

Why: one peer flooding the control socket made 7,600 ``control_peer_refused`` lines in 20 s,
each a journal entry, burying everything else. A bounded number of lines per episode and key
(at most two: the first and the count) is all an operator needs to see it happened and how much.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass


@dataclass
class _Episode:
    first_at: float
    last_at: float
    suppressed: int = 0


class Repeats:
    """Per key: ``note(key)`` is True for the first of an episode (say it), False for a repeat
    (counted). When ``window_s`` passes without a repeat, ``ended(key, suppressed, seconds)`` is
    called, on a timer thread, for an episode that had repeats. ``close`` says what is still open."""

    def __init__(self, window_s: float, ended: Callable[[Hashable, int, float], None], *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.ended = ended
        self.clock = clock
        self._open: dict[Hashable, _Episode] = {}
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()
        self._closed = False

    def note(self, key: Hashable) -> bool:
        now = self.clock()
        stale: _Episode | None = None
        with self._lock:
            if self._timer is None and not self._closed:
                self._arm(self.window_s)
            ep = self._open.get(key)
            if ep is not None and now - ep.last_at >= self.window_s:
                stale, ep = ep, None  # quiet for the window already: its timer is late, this is a new episode
            if ep is None:
                self._open[key] = _Episode(now, now)
            else:
                ep.last_at = now
                ep.suppressed += 1
        if stale is not None and stale.suppressed:
            self.ended(key, stale.suppressed, stale.last_at - stale.first_at)
        return ep is None

    def _arm(self, delay: float) -> None:
        self._timer = threading.Timer(max(0.0, delay), self._tick)
        self._timer.daemon = True
        self._timer.start()

    def _tick(self) -> None:
        """End the episodes quiet for ``window_s``; re-arm for the earliest still open."""
        now = self.clock()
        done: list[tuple[Hashable, _Episode]] = []
        with self._lock:
            self._timer = None
            for key, ep in list(self._open.items()):
                if now - ep.last_at >= self.window_s:
                    del self._open[key]
                    done.append((key, ep))
            if self._open and not self._closed:
                self._arm(min(ep.last_at for ep in self._open.values()) + self.window_s - now)
        for key, ep in done:
            if ep.suppressed:
                self.ended(key, ep.suppressed, ep.last_at - ep.first_at)

    def close(self) -> None:
        """Say the counts of the episodes still open (the daemon exits)."""
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            done, self._open = list(self._open.items()), {}
        for key, ep in done:
            if ep.suppressed:
                self.ended(key, ep.suppressed, ep.last_at - ep.first_at)
