"""The metric records on their way from the output thread to the main loop.

The output thread (parsers, the client metrics reader) puts each record here; the loop keeps
them a bounded chunk per turn. A burst larger than the buffer pushes out the oldest records:
they are counted, so every printed metric line is either kept or counted (``status``
``metrics_dropped`` and the ``metrics_dropped`` event).
"""

from __future__ import annotations

from collections import deque

from ..events import MetricRecord

# Records kept per loop turn (about 10 ms of work on one core): a burst of 100 000 kept in one
# go held the loop (and every control reply waiting on it) for seconds on a loaded machine; the
# rest waits for the next turn, which comes at once while the buffer is not empty.
METRIC_CHUNK = 2000
BUFFER_RECORDS = 100_000
HISTORY_RECORDS = 50_000  # what concerns read back (validation baselines, the launch's history)
DROPPED_NOTICE_S = 5.0  # while a burst lasts, the dropped count is said at most this often


class MetricBuffer:
    """Filled from any thread by :meth:`put`; emptied by the main loop alone."""

    def __init__(self) -> None:
        self.waiting: deque[MetricRecord] = deque(maxlen=BUFFER_RECORDS)
        self.dropped = 0  # records a burst pushed out of ``waiting`` before the loop kept them
        self.last: MetricRecord | None = None  # the newest record of the current attempt
        self.history: deque[MetricRecord] = deque(maxlen=HISTORY_RECORDS)
        self._dropped_said = (0, float("-inf"))  # the count last said, and when (monotonic)

    def put(self, rec: MetricRecord) -> None:
        """Thread-safe (one deque append): parsers and the client metrics reader call this."""
        self.last = rec
        if len(self.waiting) == self.waiting.maxlen:
            self.dropped += 1  # the oldest record falls out: counted, recorded, shown
        self.waiting.append(rec)

    def take(self) -> list[MetricRecord]:
        """The oldest waiting records, at most :data:`METRIC_CHUNK`, now also in :attr:`history`."""
        batch: list[MetricRecord] = []
        while self.waiting and len(batch) < METRIC_CHUNK:
            batch.append(self.waiting.popleft())
        self.history.extend(batch)
        return batch

    def dropped_to_say(self, now: float, burst_over: bool) -> int | None:
        """The dropped count when it grew and is due to be said (at once when the burst is over,
        else at most every :data:`DROPPED_NOTICE_S`); None otherwise."""
        said, at = self._dropped_said
        if self.dropped > said and (burst_over or now - at >= DROPPED_NOTICE_S):
            self._dropped_said = (self.dropped, now)
            return self.dropped
        return None
