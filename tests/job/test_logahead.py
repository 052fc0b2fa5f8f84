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
