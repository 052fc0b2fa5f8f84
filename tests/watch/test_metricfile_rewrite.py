"""A metric file rewritten in place to the size already read (``open(path, "w")`` of the same
bytes: a fresh attempt writing its NaN again) is read again; a file only touched is not re-parsed."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

from tests.watch.test_metricfiles import Watch

ROWS = "step,train_loss\n" + "".join(f"{i},{'nan' if i >= 4 else 2.0 - i * 0.1}\n" for i in range(1, 7))


def bump(p: Path, k: int) -> None:
    st = p.stat()
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + k * 1_000_000))  # a clock coarser than the writes


def test_a_later_attempt_rewriting_the_same_bytes_is_read_again_and_its_nan_caught(tmp_path: Path) -> None:
    w = Watch([tmp_path], use_inotify=False)
    w.mf.baseline()
    m = tmp_path / "lightning_logs" / "version_0" / "metrics.csv"
    m.parent.mkdir(parents=True)
    m.write_text(ROWS)  # attempt 0 writes it whole at its exit
    w.mf.scan_now()
    assert w.steps() == [1, 2, 3, 4, 5, 6] and len(w.detections) == 1
    w.lw.reset(1, None)
    w.mf.baseline()  # before attempt 1's spawn: nothing new
    assert w.steps() == [1, 2, 3, 4, 5, 6]
    m.write_text(ROWS)  # attempt 1, a fresh start: the same bytes, the same size
    bump(m, 1)
    w.mf.scan_now()
    assert w.steps() == [1, 2, 3, 4, 5, 6] * 2
    [_, again] = w.detections
    assert again.step == 4 and math.isnan(w.records[-3].loss or 0.0)
    for k in range(2, 30):  # touched at every pass from then on: no row read again
        bump(m, k)
        w.mf.scan_now()
    assert len(w.records) == 12 and len(w.detections) == 2


def test_a_touched_file_is_not_re_read_and_a_same_size_change_in_one_attempt_is(tmp_path: Path) -> None:
    w = Watch([tmp_path], use_inotify=False)
    w.mf.baseline()
    m = tmp_path / "m.jsonl"
    line = lambda step, loss: json.dumps({"step": step, "loss": loss}) + "\n"  # noqa: E731
    m.write_text(line(1, 1.0) + line(2, 0.9))
    w.mf.scan_now()
    assert w.steps() == [1, 2]
    for k in range(1, 40):  # touched at every pass: two small reads, nothing parsed or delivered
        bump(m, k)
        w.mf.scan_now()
    assert w.steps() == [1, 2] and w.detections == []
    m.write_text(line(1, 1.0) + line(2, 0.7))  # the same size, another value: rewritten
    bump(m, 50)
    w.mf.scan_now()
    assert w.steps() == [1, 2, 1, 2] and w.records[-1].loss == 0.7
    for k in range(51, 60):
        bump(m, k)
        w.mf.scan_now()
    assert len(w.records) == 4
