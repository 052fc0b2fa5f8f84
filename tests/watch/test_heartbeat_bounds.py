"""The heartbeat folder's bounds (issue 34 part 3, watch/hbfiles.py): the job writes that folder,
so it may fill it with 100,000 files, put a FIFO, a directory, a device or a link out in a rank
file's place, grow a file without a newline or name files with control bytes. Each check costs a
bounded time and memory, nothing blocks, what is refused is said once, and a real rank among all
that is still found and judged hung when it stops beating. Through the real daemon:
tests/e2e/test_heartbeat_dir_e2e.py."""
from __future__ import annotations

import json
import math
import os
import stat
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from supervisor.core.observations import Detection
from supervisor.watch.config import HeartbeatConfig
from supervisor.watch.hbfiles import LIST_PER_CHECK, MAX_RANK_FILES, RECORD_READ
from supervisor.watch.heartbeat import HeartbeatMonitor
from tests.watch.test_heartbeat import Clock, Lines, ctx_for, write_hb

ENTRIES = 100_000  # ~50 checks' listing, 390x the files followed
JUNK_RANKS = 10 * MAX_RANK_FILES  # files under rank names holding no record


def poll_within(m: HeartbeatMonitor, now: float, limit_s: float = 30.0) -> float:
    """``m.poll(now)`` on a thread (a blocking open must fail the test, not hang it); its time."""
    t0 = time.monotonic()
    th = threading.Thread(target=m.poll, args=(now,), daemon=True)
    th.start()
    th.join(limit_s)
    assert not th.is_alive(), "a heartbeat check blocked"
    return time.monotonic() - t0


def hostile(hb: Path, outside: Path) -> None:
    """What a job may leave in its heartbeat folder, beside the real ranks' files."""
    hb.mkdir(parents=True, exist_ok=True)
    outside.mkdir(exist_ok=True)
    for i in range(ENTRIES - JUNK_RANKS):
        os.close(os.open(hb / f"junk-{i}", os.O_CREAT | os.O_WRONLY, 0o644))
    for i in range(JUNK_RANKS):
        (hb / f"heartbeat-rank{1000 + i}.json").write_bytes(b"not a record")
    os.mkfifo(hb / "heartbeat-rank1.json")  # an open() of it for reading would block
    os.mkfifo(hb / "metrics-rank1.jsonl")
    (hb / "heartbeat-rank2.json").mkdir()
    with open(hb / "heartbeat-rank3.json", "wb") as f:
        f.truncate(2 << 30)  # 2 GB sparse, no newline
    (outside / "hb.json").write_text("{}")
    os.symlink(outside / "hb.json", hb / "heartbeat-rank4.json")  # rewritten with a fresh record below
    (outside / "metrics.jsonl").write_text('{"step": 1, "loss": NaN}\n')
    os.symlink(outside / "metrics.jsonl", hb / "metrics-rank4.jsonl")
    (hb / "heartbeat-rank\x1b[31m5\n.json").write_text("control bytes")
    if os.geteuid() == 0:
        os.mknod(hb / "heartbeat-rank6.json", 0o644 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's
    for i in range(100 * MAX_RANK_FILES // 10):
        (hb / f"metrics-rank{2000 + i}.jsonl").write_text("")


@pytest.mark.slow
def test_a_folder_of_100000_hostile_files_costs_each_check_a_bound_and_a_real_rank_is_found_and_judged(
        tmp_path: Path) -> None:
    hb, outside = tmp_path / "hb", tmp_path / "outside"
    hostile(hb, outside)
    clock = Clock()
    out: list[Detection] = []
    sink = Lines()
    m = HeartbeatMonitor(HeartbeatConfig(timeout_s=30, check_interval_s=0.25), metrics_sink=sink, wall=clock.wall,
                         tail_poll_interval_s=0.05)
    checks = math.ceil(ENTRIES / LIST_PER_CHECK) + math.ceil(JUNK_RANKS / MAX_RANK_FILES) + 4
    with capture_logs() as logs:
        m.start(ctx_for(hb, clock.mono), out.append)
        try:
            fresh = json.loads(json.dumps({"rank": 4, "t": clock.wall(), "seq": 1, "attempt": 0}))
            (outside / "hb.json").write_text(json.dumps(fresh))  # a fresh record, through a link: not read
            (hb / "heartbeat-rank9.json").write_text(json.dumps({**fresh, "rank": 8}))  # another rank's record
            write_hb(hb, 0, clock.wall(), seq=1)
            worst, seq = 0.0, 1
            tracemalloc.start()
            for _ in range(2 * checks):  # two whole passes through the folder
                seq += 1
                write_hb(hb, 0, clock.wall(), seq=seq)  # the real rank beats every check
                worst = max(worst, poll_within(m, clock.advance(0.25)))
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            assert list(m.heartbeats()) == [0], m.heartbeats()  # only the real rank: no link, no other's record
            assert m._dir is not None and m._dir.passes >= 1  # the whole folder was listed
            # measured: 3 ms a check (median), 40-170 ms at worst on a loaded 2-core machine (a thread
            # start included); a whole listing of the folder is 60-190 ms
            assert worst < 2.0, worst
            assert peak < 16 << 20, peak  # measured 2.5 MB: never the listing, 4 KiB a file read
            tailer = m._tailer
            assert tailer is not None
            followed = set(tailer.status()["files"])  # type: ignore[call-overload]
            assert len(tailer.patterns) <= MAX_RANK_FILES
            assert not {str(hb / "metrics-rank1.jsonl"), str(hb / "metrics-rank4.jsonl")} & followed
            assert not [ln for _, ln in sink.lines if "NaN" in ln]  # the link out drives nothing
            # It stops beating: judged hung at its timeout, the junk around it notwithstanding.
            for _ in range(40 * 4):
                poll_within(m, clock.advance(0.25))
                if out:
                    break
        finally:
            m.stop()
            m.close()
    assert out and out[0].details["kind"] == "heartbeat" and out[0].details["rank"] == 0, out
    refused = {e["path"].rsplit("/", 1)[-1]: e["why"] for e in logs if e["event"] == "heartbeat_file_refused"}
    want = {"heartbeat-rank1.json": "a FIFO", "heartbeat-rank2.json": "a directory",
            "heartbeat-rank4.json": "a link (not followed)"}
    if os.geteuid() == 0:
        want["heartbeat-rank6.json"] = "a device"
    assert refused == want, refused
    said = [e["event"] for e in logs if e["event"].startswith("heartbeat_file")]
    assert len(said) == len(want) + 1, said  # each once (QuietLog), whatever the number of checks; + the cap
    assert not any("\x1b" in json.dumps(e) or "junk-" in json.dumps(e) for e in logs)  # foreign names never said


def test_a_file_that_grows_without_a_newline_costs_a_4k_read(tmp_path: Path) -> None:
    hb = tmp_path / "hb"
    clock = Clock()
    write_hb(hb, 0, clock.wall(), seq=1)
    with open(hb / "heartbeat-rank0.json", "ab") as f:
        f.truncate(100 * (1 << 20))  # the record, then 100 MB without a newline
    m = HeartbeatMonitor(HeartbeatConfig(timeout_s=30, check_interval_s=0.25), wall=clock.wall)
    m.start(ctx_for(hb, clock.mono), lambda det: None)
    try:
        tracemalloc.start()
        for _ in range(4):
            poll_within(m, clock.advance(0.25))
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    finally:
        m.close()
    assert peak < 100 * RECORD_READ, peak
    assert list(m.heartbeats()) == []  # no record in the first 4 KiB: the padding is NUL, not JSON


def test_a_record_saying_a_huge_world_size_costs_nothing(tmp_path: Path) -> None:
    hb = tmp_path / "hb"
    clock = Clock()
    write_hb(hb, 0, clock.wall(), seq=1, world_size=2**31 - 1)
    m = HeartbeatMonitor(HeartbeatConfig(timeout_s=30, startup_timeout_s=1, check_interval_s=0.25,
                                         expect_heartbeats=True), wall=clock.wall)
    out: list[Detection] = []
    m.start(ctx_for(hb, clock.mono), out.append)
    try:
        poll_within(m, clock.advance(0.25))
        took = poll_within(m, clock.advance(2))
    finally:
        m.close()
    assert took < 1.0, took
    assert out and "rank(s) 1, 2, 3, 4, 5, 6, 7, 8 ..." in out[0].summary, out


@pytest.mark.parametrize("swap", ["fifo", "link"])
def test_a_heartbeat_folder_swapped_for_a_link_or_a_fifo_is_not_read(tmp_path: Path, swap: str) -> None:
    hb, outside = tmp_path / "hb", tmp_path / "outside"
    clock = Clock()
    write_hb(outside, 0, clock.wall(), seq=1)
    if swap == "link":
        os.symlink(outside, hb)
    else:
        os.mkfifo(hb)
    m = HeartbeatMonitor(HeartbeatConfig(timeout_s=30, check_interval_s=0.25), wall=clock.wall)
    m.start(ctx_for(hb, clock.mono), lambda det: None)
    try:
        poll_within(m, clock.advance(0.25))
    finally:
        m.close()
    assert m.heartbeats() == {}
    assert "heartbeat directory unreadable" in str(m.status()["problem"])
