"""metrics_blind's walk of what the attempt wrote takes at most MAX_WALK entries of a folder's
listing (issue 34): a folder of 100x that many files costs the bound, not the folder."""
from __future__ import annotations

import os
import time
import tracemalloc
from pathlib import Path

from supervisor.watch.candidates import MAX_WALK, written_files


def test_a_folder_of_100x_max_walk_files_costs_the_walk_s_bound(tmp_path: Path) -> None:
    since = time.time() - 60
    big = tmp_path / "out"
    big.mkdir()
    for i in range(100 * MAX_WALK):
        os.close(os.open(big / f"f{i}.log", os.O_CREAT | os.O_WRONLY, 0o644))
    tracemalloc.start()
    try:
        found = written_files([tmp_path], since, set())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert 0 < len(found) <= MAX_WALK
    assert peak < 2 << 20, peak  # 50,000 DirEntry objects held at once were about 10 MB


def test_a_written_files_name_is_said_through_the_one_escaper(tmp_path: Path) -> None:
    """A name that carries a newline or a bidi override reaches metrics_blind's message escaped:
    it can neither forge a line nor make its end read as its start."""
    since = time.time() - 60
    for name in ("a\nstep 9 loss nan.log", "gnp.\u202etxt.log"):
        (tmp_path / name).write_text("x\n")
    said = sorted(w.name for w in written_files([tmp_path], since, set()))
    assert said == ["a\\nstep 9 loss nan.log", "gnp.\\u202etxt.log"], said
