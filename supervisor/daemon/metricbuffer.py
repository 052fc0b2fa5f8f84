"""The metric records on their way from the output thread to the main loop.

The output thread (parsers, the client metrics reader) puts each record here; the loop keeps
them a bounded chunk per turn. A producer finding the buffer full waits for the loop to make room
(at most :data:`PUT_WAIT_S`): the output thread is behind the job by then anyway, and the job
does not wait for it (the output keeper leaves a burst in job.log for the parsers to read back),
so a burst costs the daemon time, not records. Only a loop that takes nothing for that long makes
a full buffer push out its oldest records: they are counted, so every printed metric line is
either kept or counted (``status`` ``metrics_dropped`` and the ``metrics_dropped`` event).
"""

from __future__ import annotations

import threading
from collections import deque

from ..core.observations import MetricRecord

# Records kept per loop turn: a burst of 100 000 kept in one go held the loop (and every control
# reply waiting on it) for seconds on a loaded machine; the rest waits for the next turn, which
# comes at once while the buffer is not empty. Under a 300 000-line flood on 2 cores, 2000 a turn
# put the median control reply at 56 ms, 500 at 17-22 ms, with the same catch-up time.
METRIC_CHUNK = 500
BUFFER_RECORDS = 100_000
HISTORY_RECORDS = 50_000  # what concerns read back (validation baselines, the launch's history)
DROPPED_NOTICE_S = 5.0  # while a burst lasts, the dropped count is said at most this often
# How long a producer waits for room: far above a loop turn, so only a stuck loop drops records.
PUT_WAIT_S = 10.0


class MetricBuffer:
    """Filled from any thread by :meth:`put`; emptied by the main loop alone."""

    def __init__(self, put_wait_s: float = PUT_WAIT_S) -> None:
        self.put_wait_s = put_wait_s
        self.waiting: deque[MetricRecord] = deque(maxlen=BUFFER_RECORDS)
        self.dropped = 0  # records a burst pushed out of ``waiting`` before the loop kept them
        self.last: MetricRecord | None = None  # the newest record of the current attempt
        self.history: deque[MetricRecord] = deque(maxlen=HISTORY_RECORDS)
        self._dropped_said = (0, float("-inf"))  # the count last said, and when (monotonic)
        self._room = threading.Condition()
        self._taker: int | None = None  # the loop's thread: it never waits on itself
        self._stuck = False  # a wait for room ran out: no more waits until the loop takes again

    def put(self, rec: MetricRecord) -> None:
        """Thread-safe: parsers and the client metrics reader call this. With the buffer full,
        waits for the loop to take records (bounded), except on the loop's own thread."""
        self.last = rec
        if len(self.waiting) >= BUFFER_RECORDS and not self._stuck and threading.get_ident() != self._taker:
            with self._room:
                if not self._room.wait_for(lambda: len(self.waiting) < BUFFER_RECORDS, self.put_wait_s):
                    self._stuck = True
        if len(self.waiting) == self.waiting.maxlen:
            self.dropped += 1  # the oldest record falls out: counted, recorded, shown
        self.waiting.append(rec)

    def take(self) -> list[MetricRecord]:
        """The oldest waiting records, at most :data:`METRIC_CHUNK`, now also in :attr:`history`."""
        self._taker = threading.get_ident()
        batch: list[MetricRecord] = []
        while self.waiting and len(batch) < METRIC_CHUNK:
            batch.append(self.waiting.popleft())
        if batch:
            self._stuck = False
            with self._room:
                self._room.notify_all()
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
