"""Generated metric files through the real readers (issue 34 part 8: the hypothesis suite grows
from parsers to every input surface). TensorBoard event files, CSV and JSONL, each written as a
story the job could tell: records with finite losses or a non-finite one in any spelling, garbage
between them, a line or record past the reader's bound, the file torn at any byte and then
finished, left torn for good, or (CSV) rewritten whole with a wider header as Lightning does.
Fed to the real :class:`MetricFiles` and :class:`LogWatcher`, pass by pass:

- nothing raises (no ``*_failed`` or ``metric_file_unreadable`` report: those are swallowed
  exceptions);
- the bytes a reader holds between passes stay under its stated bound (``MAX_RECORD_LINE`` for
  a text file's unfinished line; ``KEEP_RECORD`` plus one read for an event file);
- a non-finite training loss written as a complete record is always a ``nan`` detection;
- a file with no non-finite value never is.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from supervisor.events import Cause
from supervisor.core.observations import Detection
from supervisor.watch.metricfiles import READ_BUDGET
from supervisor.watch.readbounds import MAX_RECORD_LINE
from supervisor.watch.tbevents import KEEP_RECORD, masked_crc
from tests.helpers.fuzzseed import fuzz
from tests.watch.test_metricfile_bounds import tb_record
from tests.watch.test_metricfiles import Watch

SUITE = fuzz(60, HealthCheck.too_slow, HealthCheck.data_too_large)  # seeded from the run

TB = "events.out.tfevents.1700000000.host.1.0"
NAMES = {"jsonl": "metrics.jsonl", "csv": "metrics.csv", "tb": TB}
# Non-finite, as each format can spell it. float() and the readers' parse_number take all of
# the CSV ones; JSON has its three tokens, and a string value is parsed as a CSV cell is.
CSV_SPELLINGS = ["nan", "NaN", "NAN", "-nan", "+nan", "inf", "-inf", "+inf", "Inf", "INF", "Infinity", "-Infinity",
                 "infinity", "nan.0", "inf.0", "-inf."]
JSON_SPELLINGS = ["NaN", "Infinity", "-Infinity"] + [json.dumps(s) for s in ("nan", "NaN", "-inf", "Infinity", "inf")]
FAILED = ("metric_files_scan_failed", "metric_files_sink_failed", "metric_file_unreadable", "logwatch_failed",
          "logwatch_emit_failed", "logwatch_metric_sink_failed", "logwatch_line_failed")


@dataclass(frozen=True)
class Row:
    value: float | str  # a str: a non-finite value as the format spells it (a float NaN/inf for TB)


@dataclass(frozen=True)
class Garbage:
    data: bytes


@dataclass(frozen=True)
class Oversized:
    extra: int  # bytes past the reader's bound


Segment = Row | Garbage | Oversized


def nonfinite(kind: str) -> st.SearchStrategy[Row]:
    if kind == "tb":
        return st.sampled_from([math.nan, math.inf, -math.inf, -math.nan]).map(Row)
    return st.sampled_from(CSV_SPELLINGS if kind == "csv" else JSON_SPELLINGS).map(Row)


FINITE = st.floats(min_value=-1e30, max_value=1e30, allow_nan=False, allow_infinity=False).map(Row)
NOT_A_SPELLING = st.binary(max_size=60).filter(lambda b: b"nan" not in b.lower() and b"inf" not in b.lower())


@st.composite
def stories(draw: st.DrawFn, with_nonfinite: bool) -> tuple[str, list[Segment], float, str]:
    """(kind, segments, where the first write is cut (a fraction of the bytes), then what happens)."""
    kind = draw(st.sampled_from(["jsonl", "csv", "tb"]))
    parts = [FINITE, FINITE, NOT_A_SPELLING.map(Garbage), st.integers(1, 64).map(Oversized)]
    if with_nonfinite:
        parts.append(nonfinite(kind))
    segments = draw(st.lists(st.one_of(*parts), max_size=12))
    garbage = [s for s in segments if isinstance(s, Garbage)]
    oversized = [s for s in segments if isinstance(s, Oversized)]
    segments = [s for s in segments if not isinstance(s, Garbage) or s in garbage[:4]]  # a few: JSONL's probe
    segments = [s for s in segments if not isinstance(s, Oversized) or s is oversized[0]]  # one: 1 MiB a write
    if with_nonfinite and not any(isinstance(s, Row) and not is_finite(s) for s in segments):
        segments.insert(draw(st.integers(0, len(segments))), draw(nonfinite(kind)))
    then = draw(st.sampled_from(["finish", "torn"] + (["rewrite"] if kind == "csv" else [])))
    return kind, segments, draw(st.floats(0.0, 1.0)), then


def is_finite(row: Row) -> bool:
    return isinstance(row.value, float) and math.isfinite(row.value)


def big_tb_record() -> bytes:
    """A well-framed record too big to be a scalar (passed over unread)."""
    event = b"\x00" * (KEEP_RECORD + 1)
    head = (len(event)).to_bytes(8, "little")
    return head + masked_crc(head).to_bytes(4, "little") + event + masked_crc(event).to_bytes(4, "little")


def encode(kind: str, segments: list[Segment], *, extra_column: bool = False) -> tuple[bytes, list[tuple[int, int]]]:
    """The file's bytes, and the (start, end) byte span of each non-finite record (its newline in)."""
    out = bytearray(b"step,loss,epoch\n" if extra_column else b"step,loss\n") if kind == "csv" else bytearray()
    spans: list[tuple[int, int]] = []
    for step, seg in enumerate(segments, start=1):
        start = len(out)
        if isinstance(seg, Row):
            if kind == "tb":
                out += tb_record(step, float(seg.value))
            elif kind == "csv":
                value = seg.value if isinstance(seg.value, str) else repr(seg.value)
                out += f"{step},{value}{',0' if extra_column else ''}\n".encode()
            else:
                value = seg.value if isinstance(seg.value, str) else repr(seg.value)
                out += f'{{"step": {step}, "loss": {value}}}\n'.encode()
            if not is_finite(seg):
                spans.append((start, len(out)))
        elif isinstance(seg, Garbage):
            out += seg.data if kind == "tb" else seg.data.replace(b"\n", b" ") + b"\n"
        else:
            out += big_tb_record() if kind == "tb" else b"y" * (MAX_RECORD_LINE + seg.extra) + b"\n"
    return bytes(out), spans


def drain(w: Watch) -> None:
    """Pass after pass until the readers are idle, checking what each holds between passes."""
    deadline = time.monotonic() + 60
    while True:
        more = w.mf.scan_now()
        for f in list(w.mf._files.values()):
            assert f.lines.pending <= MAX_RECORD_LINE, (f.path, f.lines.pending)
            if f.tb is not None:
                assert f.tb.pending <= KEEP_RECORD + 16 + READ_BUDGET, (f.path, f.tb.pending)
        if not more and not any(f.tb is not None and f.tb.throttled for f in w.mf._files.values()):
            return
        assert time.monotonic() < deadline, "the readers did not catch up"


def run_story(kind: str, segments: list[Segment], cut: float, then: str) -> tuple[list[Detection], bool, list[Any]]:
    """Write the story under a fresh root; (the nan detections, whether a non-finite record was
    written complete, the logs)."""
    data, spans = encode(kind, segments)
    at = int(cut * len(data))
    with tempfile.TemporaryDirectory(prefix="fuzzmf") as root, capture_logs() as logs:
        w = Watch([Path(root)], use_inotify=False)
        w.mf.baseline()  # before the job: the empty root is history
        path = Path(root) / NAMES[kind]
        path.write_bytes(data[:at])
        os.utime(path)  # newer than the baseline whatever the clock's granularity
        drain(w)
        complete = any(end <= at for _, end in spans)
        if then == "finish":
            with open(path, "ab") as fh:
                fh.write(data[at:])
            complete = bool(spans)
        elif then == "rewrite":  # Lightning: the whole file again, a wider header, then a new finite row
            wider, _ = encode(kind, [*segments, Row(1.0)], extra_column=True)
            path.write_bytes(wider)
            complete = bool(spans)
        drain(w)
        w.mf.close()
    nans = [d for d in w.detections if d.cause is Cause.NAN]
    return nans, complete, logs


@SUITE
@given(stories(with_nonfinite=True))
# Found by a run's own seed: a bare "\r" in a CSV row made the csv module raise, and the chunk's
# records (the NaN row before it) were lost with the row.
@example(("csv", [Row(value="nan"), Garbage(data=b"\r\x00")], 0.0, "finish"))
def test_a_nonfinite_loss_written_as_a_complete_record_is_always_detected(story) -> None:
    kind, segments, cut, then = story
    nans, complete, logs = run_story(kind, segments, cut, then)
    assert not [e for e in logs if e["event"] in FAILED], [e for e in logs if e["event"] in FAILED]
    if complete:
        assert len(nans) == 1, (kind, then, segments)
    assert len(nans) <= 1  # one nan an attempt


@SUITE
@given(stories(with_nonfinite=False))
def test_a_file_with_no_nonfinite_value_never_yields_a_nan_detection(story) -> None:
    kind, segments, cut, then = story
    nans, _, logs = run_story(kind, segments, cut, then)
    assert not [e for e in logs if e["event"] in FAILED], [e for e in logs if e["event"] in FAILED]
    assert nans == [], (kind, then, segments, nans)
