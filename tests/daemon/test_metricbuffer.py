"""The metric buffer between the output thread and the loop: chunks, the history, drops counted."""
from __future__ import annotations

import threading

from supervisor.daemon.metricbuffer import (BUFFER_RECORDS, DROPPED_NOTICE_S, METRIC_CHUNK, MetricBuffer)
from supervisor.core.observations import MetricRecord
from tests.util import wait_for


def test_records_are_taken_in_order_a_chunk_at_a_time_and_kept_in_the_history():
    b = MetricBuffer()
    for i in range(METRIC_CHUNK + 5):
        b.put(MetricRecord(i, loss=1.0, at=0.0))
    first = b.take()
    assert [r.step for r in first] == list(range(METRIC_CHUNK))
    assert [r.step for r in b.take()] == list(range(METRIC_CHUNK, METRIC_CHUNK + 5))
    assert b.take() == [] and not b.waiting
    assert len(b.history) == METRIC_CHUNK + 5 and b.last is not None and b.last.step == METRIC_CHUNK + 4


def test_a_burst_over_the_buffer_keeps_the_newest_and_counts_the_rest():
    b = MetricBuffer(put_wait_s=0.05)  # a loop that takes nothing: the producers wait once, then drop
    writers = [threading.Thread(target=lambda base=base: [b.put(MetricRecord(base + i, at=0.0)) for i in range(40_000)])
               for base in (0, 1_000_000, 2_000_000)]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    assert len(b.waiting) == BUFFER_RECORDS and b.dropped == 3 * 40_000 - BUFFER_RECORDS


def test_a_producer_waits_for_the_loop_to_make_room_so_a_burst_loses_nothing():
    b = MetricBuffer()
    n = BUFFER_RECORDS + 3 * METRIC_CHUNK
    writer = threading.Thread(target=lambda: [b.put(MetricRecord(i, at=0.0)) for i in range(n)])
    writer.start()
    wait_for(lambda: len(b.waiting) == BUFFER_RECORDS, 30, what="the buffer filling up")
    taken: list[int] = []
    while writer.is_alive() or b.waiting:  # the loop: a chunk per turn
        taken.extend(r.step for r in b.take())
    writer.join()
    assert taken == list(range(n)) and b.dropped == 0


def test_the_loop_itself_never_waits_on_a_full_buffer():
    b = MetricBuffer()
    b.take()  # this thread is the loop's
    for i in range(BUFFER_RECORDS + 10):
        b.put(MetricRecord(i, at=0.0))
    assert b.dropped == 10 and b.waiting[0].step == 10


def test_the_drop_is_said_when_it_grows_at_most_every_few_seconds_while_the_burst_lasts():
    b = MetricBuffer()
    assert b.dropped_to_say(0.0, burst_over=True) is None  # nothing dropped: nothing to say
    b.dropped = 10
    assert b.dropped_to_say(100.0, burst_over=False) == 10
    b.dropped = 20
    assert b.dropped_to_say(100.0 + DROPPED_NOTICE_S / 2, burst_over=False) is None
    assert b.dropped_to_say(100.0 + DROPPED_NOTICE_S / 2, burst_over=True) == 20  # the burst ended: at once
    assert b.dropped_to_say(200.0, burst_over=True) is None  # said already, not grown
