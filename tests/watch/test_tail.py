"""FileTailer with real files: rotation, copytruncate, deletion, late creation, garbage, huge lines."""
from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path
from typing import Iterator, Sequence

import pytest

from supervisor.watch.tail import TRUNCATED_MARKER, FileTailer
from tests.util import wait_for


class Sink:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.batches: list[tuple[str, list[str]]] = []

    def feed(self, source: str, lines: Sequence[str]) -> None:
        with self.lock:
            self.batches.append((source, list(lines)))

    def lines(self, source: str | None = None) -> list[str]:
        with self.lock:
            return [ln for s, b in self.batches for ln in b if source is None or s == source]


def follow(t: FileTailer, path: Path, text: str = "") -> Path:
    """Create PATH (and its folder) holding TEXT, start the tailer, wait until it follows a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    t.start()
    wait_for(lambda: t.status()["files"], 5, what=f"{path.name} followed")
    return path


def append(path: Path, text: str | bytes) -> None:
    with open(path, "ab") as f:
        f.write(text.encode() if isinstance(text, str) else text)


@pytest.fixture(params=[True, False], ids=["inotify", "poll"])
def tail(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[FileTailer, Sink, Path]]:
    sink = Sink()
    logs = tmp_path / "logs"
    t = FileTailer(["logs/rank*.log"], tmp_path, sink, poll_interval_s=0.05, use_inotify=request.param,
                   retire_grace_s=0.3)
    yield t, sink, logs
    t.close()


def test_existing_files_start_at_end_new_files_from_start(tail: tuple[FileTailer, Sink, Path]) -> None:
    t, sink, logs = tail
    old = follow(t, logs / "rank0.log", "history line 1\nhistory line 2\n")
    append(old, "fresh 1\n")
    new = logs / "rank1.log"
    new.write_text("new file line 1\nnew file line 2\n")
    wait_for(lambda: len(sink.lines()) >= 3, 5)
    assert sink.lines(f"file:{old}") == ["fresh 1"]
    assert sink.lines(f"file:{new}") == ["new file line 1", "new file line 2"]


def test_a_folder_made_for_the_attempt_has_no_history_its_first_files_are_read_whole(tmp_path: Path) -> None:
    """The client's metric files in the attempt's own heartbeat folder: a fast job wrote its
    first steps before the monitors started; they are this attempt's, not history."""
    sink = Sink()
    hb = tmp_path / "attempt-0"
    hb.mkdir()
    (hb / "metrics-rank0.jsonl").write_text('{"step": 0}\n{"step": 1}\n')
    t = FileTailer(["metrics-rank*.jsonl"], hb, sink, poll_interval_s=0.05, history_at_start=False)
    try:
        t.start()
        append(hb / "metrics-rank0.jsonl", '{"step": 2}\n')
        wait_for(lambda: len(sink.lines()) >= 3, 5, what="every line")
        assert sink.lines() == ['{"step": 0}', '{"step": 1}', '{"step": 2}']
    finally:
        t.close()


def test_late_directory_and_partial_lines(tail: tuple[FileTailer, Sink, Path]) -> None:
    t, sink, logs = tail
    t.start()  # the directory does not exist yet
    assert t.status()["unmatched_globs"]
    logs.mkdir()
    f = logs / "rank0.log"
    append(f, "first half of a line")
    wait_for(lambda: t.status()["files"], 5)
    assert sink.lines() == []  # partial lines are buffered
    append(f, " and the rest\nline two\r\n")
    wait_for(lambda: len(sink.lines()) == 2, 5)
    assert sink.lines() == ["first half of a line and the rest", "line two"]


def test_rename_rotation(tail: tuple[FileTailer, Sink, Path]) -> None:
    t, sink, logs = tail
    f = follow(t, logs / "rank0.log")
    append(f, "a1\na2\n")
    wait_for(lambda: len(sink.lines()) == 2, 5)
    append(f, "a3 written just before rotation\n")
    os.rename(f, logs / "rank0.log.1")  # does not match the glob: drained through the open fd
    append(logs / "rank0.log.1", "a4 late write to the rotated file\n")
    f.write_text("b1\n")
    wait_for(lambda: "b1" in sink.lines(), 5)
    t.stop()
    assert sink.lines() == ["a1", "a2", "a3 written just before rotation", "a4 late write to the rotated file", "b1"]


def test_rotation_to_a_name_that_still_matches_reads_nothing_twice(tmp_path: Path) -> None:
    sink = Sink()
    t = FileTailer([str(tmp_path / "*.log*")], tmp_path, sink, poll_interval_s=0.05)
    try:
        f = follow(t, tmp_path / "train.log")
        append(f, "x1\nx2\n")
        wait_for(lambda: len(sink.lines()) == 2, 5)
        os.rename(f, tmp_path / "train.log.1")
        f.write_text("y1\n")
        wait_for(lambda: "y1" in sink.lines(), 5)
        append(tmp_path / "train.log.1", "x3\n")
        wait_for(lambda: "x3" in sink.lines(), 5)
        assert sorted(sink.lines()) == ["x1", "x2", "x3", "y1"]
    finally:
        t.close()


def test_copytruncate(tail: tuple[FileTailer, Sink, Path]) -> None:
    t, sink, logs = tail
    f = follow(t, logs / "rank0.log")
    append(f, "before 1 with some length to it\nbefore 2 with some length to it\n")
    wait_for(lambda: len(sink.lines()) == 2, 5)
    shutil.copy(f, logs / "rank0.log.1.bak")
    with open(f, "r+b") as fh:
        fh.truncate(0)
    def truncated() -> bool:
        files = t.status()["files"]
        assert isinstance(files, dict)
        return files.get(str(f)) == 0
    wait_for(truncated, 5, what="truncation noticed")
    append(f, "after 1\n")
    wait_for(lambda: "after 1" in sink.lines(), 5)
    assert sink.lines() == ["before 1 with some length to it", "before 2 with some length to it", "after 1"]


def test_deletion_and_recreation(tail: tuple[FileTailer, Sink, Path]) -> None:
    t, sink, logs = tail
    f = follow(t, logs / "rank0.log")
    append(f, "one\nunterminated tail")
    wait_for(lambda: sink.lines() == ["one"], 5)
    f.unlink()
    wait_for(lambda: not t.status()["files"], 5, what="deletion noticed")
    # The partial line is flushed once the deleted file's grace period is over.
    wait_for(lambda: sink.lines() == ["one", "unterminated tail"], 5)
    assert not t.status()["retired"]
    f.write_text("reborn\n")
    wait_for(lambda: "reborn" in sink.lines(), 5)
    assert sink.lines()[-1] == "reborn"


def test_garbage_and_a_10mb_line_cost_bounded_memory(tail: tuple[FileTailer, Sink, Path]) -> None:
    t, sink, logs = tail
    f = follow(t, logs / "rank0.log")
    garbage = bytes(range(256)) * 64 + b"\xff\xfe\x00\x80"
    append(f, garbage + b"\nok after garbage\n")
    wait_for(lambda: "ok after garbage" in sink.lines(), 5)
    with open(f, "ab") as fh:  # 10 MB without a newline, written in pieces as a job would
        for _ in range(10):
            fh.write(b"x" * (1 << 20))
            fh.flush()
    append(f, "\nok after the huge line\n")
    wait_for(lambda: "ok after the huge line" in sink.lines(), 10)
    lines = sink.lines()
    huge = [ln for ln in lines if ln.startswith("xxx")]
    assert len(huge) == 1 and huge[0].endswith(TRUNCATED_MARKER)
    assert len(huge[0]) <= t.max_line_bytes + len(TRUNCATED_MARKER)
    assert t.status()["truncated_lines"] == 1
    assert all(f_.splitter.pending <= t.max_line_bytes for f_ in t._files.values())


def test_what_the_job_writes_before_the_monitors_start_is_not_history(tail: tuple[FileTailer, Sink, Path]) -> None:
    """The baseline is taken before the spawn; the job's first lines can land before the tailer
    starts (the monitors start after the spawn): they are read, the older lines are not."""
    t, sink, logs = tail
    logs.mkdir(parents=True)
    log = logs / "rank0.log"
    log.write_text("an earlier run's NaN\n")
    t.baseline()  # the daemon, just before it spawns the first attempt
    append(log, "step 1 of this attempt\n")  # the job, before the monitors start
    t.start()
    wait_for(lambda: sink.lines(), 5, what="the job's first line")
    assert sink.lines() == ["step 1 of this attempt"]


def test_stop_drains_and_restart_keeps_offsets(tmp_path: Path) -> None:
    sink = Sink()
    f = tmp_path / "job.log"
    t = FileTailer([str(f)], tmp_path, sink, poll_interval_s=5.0, use_inotify=False)  # slow poll: stop must drain
    try:
        t.start()
        wait_for(lambda: t.status()["mode"] == "poll" and t._scans >= 1, 5)
        f.write_text("attempt 0 line\n")
        t.stop()
        assert sink.lines() == ["attempt 0 line"]
        append(f, "attempt 1 line\n")  # written between attempts: belongs to the next one
        t.start()
        wait_for(lambda: "attempt 1 line" in sink.lines(), 5)
        assert sink.lines() == ["attempt 0 line", "attempt 1 line"]
    finally:
        t.close()


def test_a_raising_sink_does_not_stop_the_tailer(tmp_path: Path) -> None:
    seen: list[str] = []

    class Bad:
        def feed(self, source: str, lines: Sequence[str]) -> None:
            seen.extend(lines)
            raise RuntimeError("broken sink")

    f = tmp_path / "a.log"
    t = FileTailer([str(f)], tmp_path, Bad(), poll_interval_s=0.05)
    try:
        t.start()
        f.write_text("1\n")
        wait_for(lambda: "1" in seen, 5)
        append(f, "2\n")
        wait_for(lambda: "2" in seen, 5)
        assert seen == ["1", "2"]
    finally:
        t.close()


def test_no_fd_leak(tmp_path: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    sink = Sink()
    t = FileTailer([str(tmp_path / "*.log")], tmp_path, sink, poll_interval_s=0.05)
    t.start()
    for i in range(5):
        (tmp_path / f"{i}.log").write_text(f"l{i}\n")
    wait_for(lambda: len(sink.lines()) == 5, 5)
    t.close()
    assert len(os.listdir("/proc/self/fd")) <= before


def test_a_log_truncated_over_and_over_is_said_once_per_window(tmp_path: Path) -> None:
    from structlog.testing import capture_logs

    sink = Sink()
    f = tmp_path / "rank0.log"
    f.write_text("")
    t = FileTailer(["rank*.log"], tmp_path, sink, use_inotify=False)
    try:
        with capture_logs() as logs:
            t.baseline()
            for i in range(20):  # a logger that truncates its file at every step (copytruncate-like)
                f.write_text(f"step {i} with a line long enough to be cut back\n")
                t.scan_now()
                f.write_text(f"s{i}\n")
                t.scan_now()
    finally:
        t.close()
    assert [e["event"] for e in logs].count("tail_file_truncated") == 1
    assert "s19" in sink.lines()  # every truncation still read from the start
