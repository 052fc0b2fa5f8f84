"""The look-ahead over job.log (job/catchup.LogAhead): only complete lines with a non-finite value,
each with the lines before it from a line's start, its stream told by job.stderr.log, the file
followed across the keeper's rotation; nothing twice."""
from __future__ import annotations

import os
from pathlib import Path

from supervisor.job.catchup import AHEAD_CONTEXT, LogAhead
from supervisor.job.keeper import stderr_log_path


def append(path: Path | str, text: str) -> None:
    with open(path, "ab") as f:
        f.write(text.encode())


def test_complete_lines_with_a_nonfinite_value_come_once_with_the_lines_before_them(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    append(log, "old attempt: loss nan\n")  # before the attempt's start: never looked at
    ahead = LogAhead(str(log), log.stat().st_size)
    append(log, "INFO starting inference\nstep 1 loss 2.0\nstep 2 loss nan\nstep 3 loss -inf, and 4 inf")
    assert ahead.look() == [("stdout", ["INFO starting inference", "step 1 loss 2.0", "step 2 loss nan"])]
    append(log, "\nnanoGPT says Infinity\n")  # the unfinished line is looked at once it ends
    found = ahead.look()
    assert [(s, lines[-1]) for s, lines in found] == [("stdout", "step 3 loss -inf, and 4 inf"),
                                                      ("stdout", "nanoGPT says Infinity")]
    assert ahead.look() == []


def test_the_context_starts_at_a_line_start_and_is_bounded(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_bytes(b"")
    ahead = LogAhead(str(log), 0)
    filler = "".join(f"step {i} loss 2.0\n" for i in range(AHEAD_CONTEXT // 8))
    append(log, filler + "step 9999 loss NaN\n")
    [(_, lines)] = ahead.look()
    assert lines[-1] == "step 9999 loss NaN" and lines[0].startswith("step ") and lines[0].endswith("loss 2.0")
    assert sum(len(x) + 1 for x in lines) <= AHEAD_CONTEXT + len("step 9999 loss NaN\n")


def test_a_line_also_in_the_stderr_log_is_stderrs(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    err = stderr_log_path(str(log))
    log.write_bytes(b"")
    Path(err).write_bytes(b"")
    ahead = LogAhead(str(log), 0)
    append(log, "step 1 loss nan\nWARNING grad norm is inf\n")
    append(err, "WARNING grad norm is inf\n")
    assert [(s, lines[-1]) for s, lines in ahead.look()] == [("stdout", "step 1 loss nan"),
                                                             ("stderr", "WARNING grad norm is inf")]


def test_a_rotated_log_is_read_to_its_end_then_the_new_one_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_bytes(b"step 1 loss 2.0\n")
    ahead = LogAhead(str(log), 0)
    assert ahead.look() == []
    append(log, "step 2 loss nan\n")
    os.rename(log, tmp_path / "job.log.1")  # the keeper's rotation
    log.write_bytes(b"step 3 loss inf\n")
    assert [lines[-1] for _, lines in ahead.look()] == ["step 2 loss nan"]
    assert [lines[-1] for _, lines in ahead.look()] == ["step 3 loss inf"]
    ahead.close()


def test_a_dense_burst_of_hits_is_bounded_and_a_value_is_chosen_first(tmp_path: Path) -> None:
    # Issue 34 D1: 50,000-200,000 finite lines that each say "nan" as a word took gigabytes (a decoded
    # 16 KiB context per hit) and minutes of CPU. Now: at most AHEAD_MAX_HITS hit lines a look, a
    # value's place first, each hit's context read only when judged, from the look's one buffer.
    import tracemalloc

    from supervisor.job.catchup import AHEAD_MAX_HITS, AHEAD_READ, AheadLines

    log = tmp_path / "job.log"
    n = 100_000
    body = "".join(f"step {s} loss {2.0 - s * 1e-7:.6f} (no nan)\n" for s in range(1, n + 1))
    log.write_bytes(body.encode() + b"step 100001 loss nan\n" + b"step 100002 loss 1.9 (no nan)\n")
    assert log.stat().st_size < AHEAD_READ
    ahead = LogAhead(str(log), 0)
    tracemalloc.start()
    found = ahead.look()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(found) == AHEAD_MAX_HITS and ahead.left_in_order == n + 2 - AHEAD_MAX_HITS
    assert peak < AHEAD_READ + AHEAD_CONTEXT + (2 << 20), peak  # the buffer, and the cap's small change
    hits = [lines[-1] for _, lines in found]
    assert "step 100001 loss nan" in hits and hits == sorted(hits, key=lambda x: int(x.split()[1]))
    assert all(isinstance(lines, AheadLines) and lines._lines is None for _, lines in found)  # nothing decoded
    [(_, nan_lines)] = [f for f in found if f[1][-1] == "step 100001 loss nan"]
    assert list(nan_lines)[-2] == "step 100000 loss 1.990000 (no nan)"  # its context, read when asked


def test_a_costly_look_holds_the_next_ones_back_for_its_cpu_share(tmp_path: Path) -> None:
    from supervisor.job.catchup import AHEAD_SHARE

    log = tmp_path / "job.log"
    log.write_bytes(b"".join(b"step %d loss 1.9 (no nan)\n" % s for s in range(100_000)))
    ahead = LogAhead(str(log), 0)
    ticks = iter([0.0, 0.1, 0.1,  # the dense look: began at 0, cost 0.1 of CPU
                  0.2,  # the next: within 0.1 / share of the CPU since
                  0.1 + 0.1 / AHEAD_SHARE, 0.5, 0.5])  # past it
    ahead._cpu = lambda: next(ticks)  # the output thread's CPU clock, driven by the test
    assert ahead.look() and ahead.left_in_order > 0  # capped: dense
    append(log, "step 100001 loss nan\n")
    assert ahead.look() == []  # held back: the line waits in job.log for the next look
    assert [lines[-1] for _, lines in ahead.look()] == ["step 100001 loss nan"]
