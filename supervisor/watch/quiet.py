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
from typing import Any, Callable, Sequence

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


#: The items a :class:`FirstFew` names one line each per window.
NAMED = 5


class FirstFew:
    """An event about items that come in bursts (metric files found: 20,000 ``*.log`` files in a
    job's tree made 3,686 ``metric_file_followed`` lines in 25 s): the first ``named`` items of each
    ``window_s`` are said one line each, the rest counted and said in one line (the first of them
    by name, ``more``: how many) at most once per window; a count not said yet goes out with the
    next window's first call."""

    event: str  # first: the event-name check (tests/test_eventnames.py) reads it at the calls

    def __init__(self, name: str, logger: Any, next: str, named: int = NAMED, window_s: float = REPEAT_AFTER_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.event, self.logger, self.next = name, logger, next
        self.named, self.window_s, self.clock = named, window_s, clock
        self._window_at: float | None = None
        self._said = 0  # named in this window
        self._counted_said = False  # the count was said in this window
        self._more = 0  # counted, not said yet
        self._first: tuple[str, dict[str, Any]] | None = None  # the first of them

    @log_helper
    def say(self, items: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """This pass's new items, (path, fields) each; call on every pass (a held count goes out)."""
        now = self.clock()
        if self._window_at is None or now - self._window_at >= self.window_s:
            self._window_at, self._said, self._counted_said = now, 0, False
        for path, fields in items:
            if self._said < self.named:
                self._said += 1
                self.logger.info(self.event, path=path, **fields, next=self.next)
                continue
            self._more += 1
            if self._first is None:
                self._first = (path, fields)
        if self._more and self._first is not None and not self._counted_said:
            path, fields = self._first
            self.logger.info(self.event, path=path, **fields, more=self._more,
                             next=f"{self._more} like it not named one by one (the first here); "
                                  f"at most {self.named} are named and one count said every {self.window_s:.0f} s")
            self._counted_said, self._more, self._first = True, 0, None


__all__ = ["MAX_KEYS", "NAMED", "PER_HOUR", "FirstFew", "QuietLog", "REPEAT_AFTER_S"]
