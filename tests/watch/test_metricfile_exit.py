"""The end of a run for the metric-file readers (issue 34, round 3): a last line written without a
newline is judged once the job is gone (never while it runs), the exit's catch-up ends only when
every file was read and its records fed up to its size at the exit, and a copy of the daemon's
own console (``| tee train.log``) is never followed as the job's log. Through the real daemon:
tests/e2e/test_end_of_run_e2e.py."""
from __future__ import annotations

import os
import random
import subprocess
import threading
import time
from pathlib import Path
from typing import Sequence

from supervisor.core.causes import Cause
from supervisor.core.observations import MetricRecord
from supervisor.watch.consolecopies import ConsoleCopies
from supervisor.watch.readbounds import BoundedLines
from tests.util import wait_for
from tests.watch.test_metricfiles import Watch


def test_bounded_lines_flush_hands_over_the_unfinished_line_once_and_never_an_over_long_one() -> None:
    b = BoundedLines(max_line=8)
    assert b.push(b"a\nstep 2") == [b"a"]
    assert b.flush() == [b"step 2"] and b.pending == 0
    assert b.flush() == []  # once
    b.push(b"x" * 20)  # past the cap: skipped (counted), nothing to hand over
    assert b.flush() == [] and b.skipped == 1
    assert b.push(b"ok\n") == [b"ok"]  # after a flush the next bytes start a new line


def test_a_last_line_without_a_newline_is_judged_at_the_exit_never_while_the_job_runs(tmp_path: Path) -> None:
    w = Watch([tmp_path], use_inotify=False)
    w.mf.baseline()
    w.mf.start()
    try:
        log, jsonl = tmp_path / "train.log", tmp_path / "metrics.jsonl"
        log.write_text("step 24 loss 0.5\nstep 25 loss nan")
        jsonl.write_text('{"step": 24, "loss": 0.5}\n{"step": 25, "loss": NaN}')
        wait_for(lambda: len(w.records) >= 2, 10, what="both files' complete lines")
        deadline = time.monotonic() + 0.5  # several passes of the reader: a partial line is being written
        while time.monotonic() < deadline:
            w.mf.scan_now()
        assert w.detections == [] and {r.step for r in w.records} == {24}
        wait_for(lambda: not w.mf.catching_up(), 10, what="the exit's catch-up")
        sources = {d.source for d in w.detections}
        assert [d.cause for d in w.detections] == [Cause.NAN]  # once per attempt, whichever file came first
        assert sources <= {f"log:{log}", f"file:{jsonl}"}
        assert sorted(r.source for r in w.records if r.step == 25) == [f"file:{jsonl}", f"log:{log}"]
    finally:
        w.mf.stop()


class SlowSink:
    """Feeds the log watcher after a delay on every batch: the window between a reader taking
    bytes (its offset moved) and their records reaching the detectors, forced open."""

    def __init__(self, w: Watch, delay_s: float) -> None:
        self.w, self.delay_s = w, delay_s

    def feed_records(self, source: str, records: Sequence[MetricRecord]) -> None:
        time.sleep(self.delay_s)
        self.w.lw.feed_records(source, records)


def test_the_exit_catch_up_ends_only_after_every_record_written_before_the_exit_was_fed(tmp_path: Path) -> None:
    """20 exits, each with the NaN written a random moment before it while the reader is busy
    feeding a slow detector: when catching_up() first says False, the NaN is judged, every time."""
    rng = random.Random(34)
    for i in range(20):
        root = tmp_path / f"r{i}"
        root.mkdir()
        w = Watch([root], poll_interval_s=0.05)
        w.mf.sink = SlowSink(w, rng.choice([0.0, 0.005, 0.03]))
        w.mf.baseline()
        w.mf.start()
        try:
            path = root / "metrics.jsonl"
            stop = threading.Event()

            def job() -> None:  # writes steadily; its last record is a NaN, then it "exits"
                with open(path, "a") as f:
                    step = 0
                    while not stop.is_set():
                        step += 1
                        f.write(f'{{"step": {step}, "loss": {1.0 / step}}}\n')
                        f.flush()
                        time.sleep(0.001)
                    f.write(f'{{"step": {step + 1}, "loss": NaN}}\n')

            t = threading.Thread(target=job)
            t.start()
            wait_for(lambda: w.records, 10, what="the job's first records")
            time.sleep(rng.uniform(0.0, 0.05))  # a random point in the reader's rhythm
            stop.set()
            t.join()
            wait_for(lambda: not w.mf.catching_up(), 35, 0.001, "the exit's catch-up")
            assert [d.cause for d in w.detections] == [Cause.NAN], (i, len(w.records))
        finally:
            w.mf.stop()


def test_a_backlog_past_the_read_budget_is_waited_for_by_the_reader_thread(tmp_path: Path) -> None:
    w = Watch([tmp_path], use_inotify=False, poll_interval_s=0.05)
    w.mf.baseline()
    w.mf.start()
    try:
        lines = "".join(f'{{"step": {s}, "loss": 1.0}}\n' for s in range(1, 120_001))
        (tmp_path / "metrics.jsonl").write_text(lines + '{"step": 120001, "loss": NaN}\n')  # ~3.5 MB: 4 passes
        wait_for(lambda: not w.mf.catching_up(), 35, what="the exit's catch-up")
        assert [d.cause for d in w.detections] == [Cause.NAN] and w.detections[0].step == 120001
    finally:
        w.mf.stop()


def test_the_files_a_reader_of_our_console_pipe_writes_are_known_as_copies_of_it(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    copy, other = tmp_path / "train.log", tmp_path / "other.log"
    tee = subprocess.Popen(["tee", str(copy)], stdin=read_end, stdout=subprocess.DEVNULL)
    os.close(read_end)
    try:
        other.write_text("step 1 loss 1.0\n")
        os.write(write_end, b"step 1 loss 1.0\n")
        wait_for(lambda: copy.exists() and copy.stat().st_size > 0, 10, what="tee's copy")
        cc = ConsoleCopies(fds=[write_end])

        def ident(p: Path) -> tuple[int, int]:
            st = p.stat()
            return st.st_dev, st.st_ino

        assert cc.holds(ident(copy), copy.stat().st_mtime)
        assert not cc.holds(ident(other), other.stat().st_mtime)
        copies = ConsoleCopies(fds=[write_end]).identities()  # metrics_blind's one-off look
        assert ident(copy) in copies and ident(other) not in copies  # (tee's stderr: pytest's capture file)
        searches = cc.searches
        assert not cc.holds(ident(other), 0.0) and cc.searches == searches  # older than the search: not again
        # Not a pipe (a terminal, a file): nothing is searched at all.
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            assert not ConsoleCopies(fds=[null]).holds(ident(copy), time.time())
        finally:
            os.close(null)
    finally:
        os.close(write_end)
        tee.wait(10)
