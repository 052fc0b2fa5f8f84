"""Rate-limited warnings of the file readers: the same event about the same file at most once per
``repeat_after_s``, and at most ``per_hour`` of them in all; the next one that goes out says how
many were held back (``held_back``). A metric file rewritten every step, truncated over and over
or re-examined at each change must not write a line per change to the journal.

The rule is the one notifications follow (:class:`supervisor.ops.alertmsg.RateLimit`); this one
also forgets a file that went quiet: a job that makes a new file every step (and deletes the old)
must not grow the table for the life of the daemon, so it holds at most ``MAX_KEYS`` entries.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from typing import Any, Callable

from ..logsite import log_helper

REPEAT_AFTER_S = 300.0
PER_HOUR = 120
MAX_KEYS = 1024


class QuietLog:
    """``say(level, event, path, **fields)`` through ``logger`` when the limit admits it."""

    def __init__(self, logger: Any, repeat_after_s: float = REPEAT_AFTER_S, per_hour: int = PER_HOUR,
                 clock: Callable[[], float] = time.monotonic, max_keys: int = MAX_KEYS) -> None:
        self.logger = logger
        self.clock = clock
        self.repeat_after_s = repeat_after_s
        self.per_hour = per_hour
        self.max_keys = max_keys
        self._last: OrderedDict[tuple[str, str], tuple[float, int]] = OrderedDict()  # when said, held since
        self._said: deque[float] = deque()  # when, over the last hour
        self._lock = threading.Lock()
        self.held_back = 0

    @log_helper
    def say(self, level: str, event: str, path: str, **fields: Any) -> bool:
        """True when the line was written."""
        key = (event, path)
        with self._lock:
            now = self.clock()
            while self._said and now - self._said[0] >= 3600.0:
                self._said.popleft()
            last, held = self._last.get(key, (None, 0))
            if (last is not None and now - last < self.repeat_after_s) or len(self._said) >= self.per_hour:
                self.held_back += 1
                self._last[key] = (last if last is not None else now - self.repeat_after_s, held + 1)
                return False
            self._said.append(now)
            self._last[key] = (now, 0)
            self._last.move_to_end(key)
            while len(self._last) > self.max_keys:  # the file said least recently: its count is lost
                self._last.popitem(last=False)
        if held:
            fields["held_back"] = held
        getattr(self.logger, level)(event, path=path, **fields)
        return True


__all__ = ["MAX_KEYS", "PER_HOUR", "QuietLog", "REPEAT_AFTER_S"]
