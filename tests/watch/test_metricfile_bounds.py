"""The metric-file readers' budgets and second looks (issue 34, parts 3 and 4), on real files into
the real LogWatcher: a JSONL that grows without a newline, zero-filled / random / crafted
TensorBoard files, links out of the tree, a CSV whose first header has no loss column, a JSONL
whose first lines are no metrics, and the rate-limited warnings. The same inputs through the real
daemon: tests/e2e/test_hostile_metricfiles_e2e.py."""
from __future__ import annotations

import math
import os
import struct
import time
import tracemalloc
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from supervisor.events import Cause
from supervisor.watch import tbevents
from supervisor.watch.metricfiles import JSONL_PROBE_LINES, READ_BUDGET
from supervisor.watch.quiet import QuietLog
from supervisor.watch.readbounds import MAX_RECORD_LINE, BoundedLines
from supervisor.watch.tbevents import KEEP_RECORD, TBReader, masked_crc
from tests.watch.test_metricfiles import Watch

TB = "events.out.tfevents.1700000000.host.1.0"


# -- a TensorBoard record, written as the format says (tbevents' docstring) -----------------------

def _varint(n: int) -> bytes:
    out = b""
    while True:
        b, n = n & 0x7F, n >> 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def _field(num: int, payload: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(payload)) + payload


def tb_record(step: int, value: float, tag: bytes = b"train/loss") -> bytes:
    value_msg = _field(1, tag) + b"\x15" + struct.pack("<f", value)
    event = b"\x09" + struct.pack("<d", 1.7e9 + step) + b"\x10" + _varint(step) + _field(5, _field(1, value_msg))
    head = struct.pack("<Q", len(event))
    return head + struct.pack("<I", masked_crc(head)) + event + struct.pack("<I", masked_crc(event))


def crafted_garbage(n: int) -> bytes:
    """Bytes where nearly every offset looks like the start of a header (a length <= 64 MiB) but
    none is one: each costs a CRC, the worst case for a resync."""
    return (b"\x01\x00\x00\x00\x00\x00\x00\x00\x07\x00\x00" * (n // 11 + 1))[:n]


def drain(w: Watch) -> None:
    deadline = time.monotonic() + 120
    while w.mf.scan_now():
        assert time.monotonic() < deadline, "the reader did not catch up"


# -- BoundedLines --------------------------------------------------------------------------------

def test_bounded_lines_hold_at_most_the_cap_and_count_a_skipped_line_once() -> None:
    b = BoundedLines(max_line=16)
    assert b.push(b'{"loss": 1') == [] and b.pending == 10
    assert b.push(b'}\n{"lo') == [b'{"loss": 1}']
    assert b.push(b"x" * 100) == [] and b.pending == 0 and b.skipped == 1  # said when the cap is passed
    assert b.push(b"x" * 100) == [] and b.skipped == 1
    assert b.push(b'xx\n{"loss": 2}\n' + b"y" * 40 + b"\nz") == [b"", b'{"loss": 2}', b""]
    assert b.skipped == 2 and b.pending == 1


# -- JSONL / CSV lines ---------------------------------------------------------------------------

def test_a_jsonl_that_grows_without_a_newline_costs_at_most_the_line_cap(tmp_path: Path) -> None:
    w = Watch([tmp_path], use_inotify=False)
    w.mf.baseline()
    huge = tmp_path / "huge.jsonl"
    with open(huge, "wb") as f:
        f.truncate(128 * MAX_RECORD_LINE)  # 128 MiB sparse, no newline: 128x the cap
    tracemalloc.start()
    try:
        with capture_logs() as logs:
            drain(w)
            with open(huge, "ab") as f:  # still no newline: the same line, longer
                f.write(b"x" * (4 * MAX_RECORD_LINE))
            drain(w)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # A read chunk and what is made of it, and the cap: never the file.
    assert peak < 3 * READ_BUDGET + 2 * MAX_RECORD_LINE, peak
    assert [e["path"] for e in logs if e["event"] == "metric_file_line_skipped"] == [str(huge)]
    with open(huge, "ab") as f:
        f.write(b'\n{"step": 7, "loss": NaN}\n')
    w.mf.scan_now()
    [nan] = w.detections
    assert nan.cause is Cause.NAN and nan.step == 7 and nan.source == f"file:{huge}"


def test_a_csv_that_exists_before_the_run_is_counted_in_chunks_not_read_whole(tmp_path: Path) -> None:
    csv = tmp_path / "metrics.csv"
    rows = 200_000
    csv.write_text("step,train_loss\n" + "".join(f"{i},{1.0 / (i + 1)}\n" for i in range(rows)))
    w = Watch([tmp_path], use_inotify=False)
    tracemalloc.start()
    try:
        w.mf.baseline()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert csv.stat().st_size > 4 << 20 and peak < 3 << 20, peak  # bounded chunks, not the file
    with open(csv, "a") as f:
        f.write(f"{rows},nan\n")
    w.mf.scan_now()
    assert [r.step for r in w.records] == [rows]  # the header kept, history not replayed
    assert w.detections[0].cause is Cause.NAN


# -- TensorBoard framing -------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["zeros", "random"])
def test_a_zero_filled_or_random_event_file_is_passed_over_at_c_speed(kind: str) -> None:
    junk = bytes(64 << 20) if kind == "zeros" else os.urandom(16 << 20)
    r = TBReader()
    cpu = time.process_time()
    for i in range(0, len(junk), 8 << 20):  # as the follower feeds it: a read chunk at a time
        r.read(junk[i:i + (8 << 20)])
    spent = time.process_time() - cpu
    # The pure-Python resync tried a CRC at every offset: minutes of a core for these.
    assert spent < 5.0, spent
    assert not r.throttled and r.pending < 12 and r.corrupt == 1
    assert [s.step for s in r.read(tb_record(3, 0.5) + tb_record(4, math.nan))] == [3, 4]


def test_the_resync_spends_at_most_its_crc_budget_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    checks = [0]
    real = tbevents.masked_crc

    def counted(data: bytes) -> int:
        checks[0] += 1
        return real(data)

    monkeypatch.setattr(tbevents, "masked_crc", counted)
    r = TBReader(resync_checks_per_s=500, clock=lambda: now[0])
    data = tb_record(1, 1.0) + crafted_garbage(11_000) + tb_record(2, 2.0)  # ~4,000 candidates
    got = [s.step for s in r.read(data)]
    seconds = 0
    while r.throttled:
        assert checks[0] <= 500 * (seconds + 1) + 10  # a second's budget, and the headers read
        assert r.pending <= len(data)  # held, not grown: nothing more is fed while throttled
        now[0] += 1.0
        seconds += 1
        got += [s.step for s in r.read(b"")]
    assert got == [1, 2] and 6 <= seconds <= 10, (got, seconds)


def test_a_record_too_big_to_be_a_scalar_is_passed_over_without_being_kept() -> None:
    big = b"\x00" * (KEEP_RECORD + 10)
    head = struct.pack("<Q", len(big))
    rec = head + struct.pack("<I", masked_crc(head)) + big + struct.pack("<I", masked_crc(big))
    r = TBReader()
    out = []
    for i in range(0, len(rec), 1 << 16):
        out += r.read(rec[i:i + (1 << 16)])
        assert r.pending < 1 << 16
    out += r.read(tb_record(5, 1.5))
    assert [s.step for s in out] == [5] and r.oversized == 1 and r.corrupt == 0


def test_a_crafted_event_file_holds_one_read_chunk_and_does_not_spin_the_follower(tmp_path: Path) -> None:
    w = Watch([tmp_path], use_inotify=False)
    w.mf.baseline()
    (tmp_path / TB).write_bytes(crafted_garbage(32 << 20))
    passes = 0
    while w.mf.scan_now():
        passes += 1
        assert passes < 10
    [f] = w.mf._files.values()
    assert f.tb is not None and f.tb.throttled and f.tb.pending <= READ_BUDGET
    assert f.offset <= READ_BUDGET  # not read on while the resync waits for its budget


# -- links ---------------------------------------------------------------------------------------

def test_a_metric_file_linked_from_out_of_the_tree_is_not_followed_and_said_once(tmp_path: Path) -> None:
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    (outside / "metrics.jsonl").write_text("")
    (work / "metrics.jsonl").symlink_to(outside / "metrics.jsonl")
    (work / "sub").mkdir()
    (work / "sub" / "real.jsonl").write_text("")
    (work / "inside.jsonl").symlink_to(work / "sub" / "real.jsonl")  # a link inside the tree is fine
    w = Watch([work], use_inotify=False)
    with capture_logs() as logs:
        w.mf.baseline()
        (outside / "metrics.jsonl").write_text('{"step": 3, "loss": NaN}\n')
        (work / "sub" / "real.jsonl").write_text('{"step": 4, "loss": 1.5}\n')
        for _ in range(3):
            w.mf.scan_now()
    refused = [e for e in logs if e["event"] == "metric_file_link_refused"]
    assert [e["path"] for e in refused] == [str(work / "metrics.jsonl")]
    assert refused[0]["target"] == str(outside / "metrics.jsonl")
    assert w.detections == [] and {r.source for r in w.records} <= {f"file:{work / 'inside.jsonl'}",
                                                                    f"file:{work / 'sub' / 'real.jsonl'}"}
    assert [r.step for r in w.records][:1] == [4]


def test_a_followed_file_swapped_for_a_link_out_is_not_read(tmp_path: Path) -> None:
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    w = Watch([work], use_inotify=False)
    w.mf.baseline()
    m = work / "metrics.jsonl"
    m.write_text('{"step": 1, "loss": 1.0}\n')
    w.mf.scan_now()
    (outside / "m.jsonl").write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "loss": NaN}\n')
    m.unlink()
    m.symlink_to(outside / "m.jsonl")
    for _ in range(2):
        w.mf.scan_now()
    assert [r.step for r in w.records] == [1] and w.detections == []


# -- no file dropped for good --------------------------------------------------------------------

def test_a_lightning_csv_first_flushed_without_a_loss_column_is_read_once_rewritten(tmp_path: Path) -> None:
    from lightning.fabric.loggers.csv_logs import _ExperimentWriter  # the writer CSVLogger uses

    w = Watch([tmp_path], use_inotify=False)
    w.mf.baseline()
    log_dir = tmp_path / "lightning_logs" / "version_0"
    writer = _ExperimentWriter(str(log_dir))
    writer.log_metrics({"lr-AdamW": 0.001, "epoch": 0}, 0)  # LearningRateMonitor's first flush
    writer.save()
    csv = log_dir / "metrics.csv"
    assert csv.read_text().splitlines()[0] == "epoch,lr-AdamW,step"
    with capture_logs() as logs:
        w.mf.scan_now()
        w.mf.scan_now()
        assert [e["event"] for e in logs if e.get("path") == str(csv)].count("metric_file_ignored") == 1
        for step in range(1, 4):  # the first train_loss: the file is rewritten with a wider header
            writer.log_metrics({"train_loss": 2.0 - step * 0.1, "epoch": 0}, step)
            writer.save()
            w.mf.scan_now()
        writer.log_metrics({"train_loss": math.nan, "epoch": 0}, 4)
        writer.save()
        w.mf.scan_now()
    assert "metric_file_reexamined" in [e["event"] for e in logs]
    assert [r.step for r in w.records if r.loss is not None] == [1, 2, 3, 4]
    [nan] = w.detections
    assert nan.cause is Cause.NAN and nan.step == 4 and nan.source == f"file:{csv}"


def test_a_csv_that_stops_matching_and_matches_again_delivers_no_row_twice(tmp_path: Path) -> None:
    w = Watch([tmp_path], use_inotify=False)
    w.mf.baseline()
    csv = tmp_path / "metrics.csv"
    csv.write_text("step,train_loss\n0,2.0\n1,1.9\n")
    w.mf.scan_now()
    csv.write_text("step,lr\n0,0.1\n1,0.1\n")  # rewritten without the loss column: dropped
    w.mf.scan_now()
    csv.write_text("step,train_loss,lr\n0,2.0,0.1\n1,1.9,0.1\n2,nan,0.1\n")
    w.mf.scan_now()
    assert [r.step for r in w.records] == [0, 1, 2]
    assert w.detections[0].cause is Cause.NAN and w.detections[0].step == 2


def test_a_jsonl_whose_first_lines_are_no_metrics_is_probed_again_when_it_grows(tmp_path: Path) -> None:
    w = Watch([tmp_path], use_inotify=False)
    w.mf.baseline()
    log = tmp_path / "run.jsonl"
    log.write_text("".join('{"event": "config", "i": %d}\n' % i for i in range(JSONL_PROBE_LINES + 5)))
    w.mf.scan_now()
    w.mf.scan_now()
    assert w.records == []
    with open(log, "a") as f:
        f.write('{"step": 1, "loss": 1.2}\n{"step": 2, "loss": NaN}\n')
    w.mf.scan_now()
    assert [r.step for r in w.records] == [1, 2] and w.detections[0].step == 2


# -- rate-limited warnings -----------------------------------------------------------------------

def test_a_file_truncated_over_and_over_is_said_once_per_window(tmp_path: Path) -> None:
    w = Watch([tmp_path], use_inotify=False)
    w.mf.baseline()
    m = tmp_path / "metrics.jsonl"
    with capture_logs() as logs:
        for step in range(30):  # rewritten from scratch at every step (a logger that does so)
            m.write_text("".join('{"step": %d, "loss": 1.0}\n' % s for s in range(step + 1)) + " " * (30 - step))
            w.mf.scan_now()
            m.write_text('{"step": %d, "loss": 1.0}\n' % step)
            w.mf.scan_now()
    assert [e["event"] for e in logs].count("metric_file_truncated") == 1


def test_quiet_log_says_the_first_then_how_many_were_held_back() -> None:
    now = [0.0]
    with capture_logs() as logs:
        q = QuietLog(__import__("structlog").get_logger("t"), repeat_after_s=60, per_hour=100, clock=lambda: now[0])
        said = [q.say("warning", "metric_file_unreadable", "/a", error="x") for _ in range(5)]
        q.say("warning", "metric_file_unreadable", "/b", error="x")  # another file: its own limit
        now[0] = 61.0
        q.say("warning", "metric_file_unreadable", "/a", error="x")
    assert said == [True, False, False, False, False] and q.held_back == 4
    assert [(e["path"], e.get("held_back")) for e in logs] == [("/a", None), ("/b", None), ("/a", 4)]


# -- many files ----------------------------------------------------------------------------------

def test_a_tree_of_10000_jsonl_files_is_walked_within_its_file_and_entry_caps(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for i in range(10_000):  # 100x past each cap below
        (data / f"shard{i:05d}.jsonl").touch()
    w = Watch([tmp_path], use_inotify=False, max_files=100, max_entries=100 + 2)
    with capture_logs() as logs:
        w.mf.baseline()
        (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "loss": NaN}\n')
        for _ in range(3):
            w.mf.scan_now()
    assert len(w.mf._files) <= 100 and w.mf.status()["capped"] is True
    capped = [e for e in logs if e["event"] == "metric_files_scan_capped"]
    assert len(capped) == 1 and capped[0]["cap"] in ("100 metric files", "102 directory entries"), capped
    # Breadth first: the file beside the data folder is still followed, and its NaN judged.
    assert [r.step for r in w.records] == [1, 2] and w.detections[0].cause is Cause.NAN


def test_quiet_log_forgets_the_files_said_least_recently_past_its_key_cap() -> None:
    now = [0.0]
    with capture_logs() as logs:
        q = QuietLog(__import__("structlog").get_logger("t"), repeat_after_s=60, per_hour=10**6,
                     clock=lambda: now[0], max_keys=100)
        for i in range(10_000):  # a job that makes a new file each step: 100x past the cap
            now[0] += 1.0
            q.say("info", "metric_file_truncated", f"/run/step{i}.jsonl")
        assert len(q._last) == 100
        q.say("info", "metric_file_truncated", "/run/step9999.jsonl")  # said a second ago: held
    assert len(logs) == 10_000 and q.held_back == 1
