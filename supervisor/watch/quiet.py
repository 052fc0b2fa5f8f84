"""Rate-limited warnings of the file readers: the same event about the same file at most once per
``repeat_after_s``, and at most ``per_hour`` of them in all; the next one that goes out says how
many were held back (``held_back``). A metric file rewritten every step, truncated over and over
or re-examined at each change must not write a warning per change to the journal.

The rule itself is the alerting concern's :class:`supervisor.ops.alertmsg.RateLimit` (one place
for "at most once per": notifications use it too); this is its use for log lines.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from ..ops.alertmsg import RateLimit

REPEAT_AFTER_S = 300.0
PER_HOUR = 120


class QuietLog:
    """``say(level, event, path, **fields)`` through ``logger`` when the limit admits it."""

    def __init__(self, logger: Any, repeat_after_s: float = REPEAT_AFTER_S, per_hour: int = PER_HOUR,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.clock = clock
        self._limit = RateLimit(repeat_after_s, per_hour)
        self._lock = threading.Lock()
        self.held_back = 0

    def say(self, level: str, event: str, path: str, **fields: Any) -> bool:
        """True when the line was written."""
        with self._lock:
            held = self._limit.admit(f"{event}\0{path}", self.clock())
            if held is None:
                self.held_back += 1
                return False
        if held:
            fields["held_back"] = held
        getattr(self.logger, level)(event, path=path, **fields)
        return True


__all__ = ["PER_HOUR", "QuietLog", "REPEAT_AFTER_S"]
