"""One followed metric file's state, and its CSV rows and JSONL lines -> records (for
:mod:`.metricfiles`, which reads the bytes; TensorBoard files go through :mod:`.tbevents`).

CSV: the first line is the header; a file whose header names no loss-like column is dropped
(until it changes: :mod:`.fileread` looks again). After a rewrite (Lightning's ``CSVLogger`` adds
a column) the rows already consumed are skipped by count (``skip_rows``). JSONL: each line a JSON
object; one with a loss-like key is a record; a file whose first ``JSONL_PROBE_LINES`` lines hold
none is dropped (a dataset, not metrics; looked at again when it changes). Python's ``nan`` /
``inf`` (an f-string's ``{"loss": nan}``) are read as values (:mod:`.pyjson`); a line that starts
like a metric record but gives none is told to ``unread`` (said and counted by the log watcher),
never counted as a probe miss. Lines come from a
:class:`~.readbounds.BoundedLines` (without their newline): an over-long one arrives empty.
"""

from __future__ import annotations

import csv
import io
import json
import time
from dataclasses import dataclass, field
from typing import Callable

from ..core.observations import MetricRecord
from .mlflowstore import MlflowDb
from .pyjson import python_spelled, unread_reason
from .readbounds import MAX_RECORD_LINE, BoundedLines
from .records import canonical_key, make_record, parse_number, record_from_mapping
from .tbevents import TBReader

JSONL_PROBE_LINES = 50
#: Told of a line that starts like a metric record but gives none: (source, the line, why).
Unread = Callable[[str, str, str], None]


@dataclass
class FileState:
    """Where reading of one followed file stands (the monitor's thread alone touches it)."""

    path: str
    kind: str
    ident: tuple[int, int]
    offset: int
    tb: TBReader | None = None
    lines: BoundedLines = field(default_factory=BoundedLines)  # csv, jsonl: the unfinished line
    header: tuple[str, ...] | None = None  # csv: column names
    header_raw: bytes = b""  # csv: the header line as written, to notice a rewrite
    rows: int = 0  # csv: data rows consumed since offset 0
    skip_rows: int = 0  # csv: rows to pass over after a rewrite (already delivered)
    probed: int = 0  # jsonl: lines seen before the first metric line
    metric_lines: int = 0
    records: int = 0
    last_step: int | None = None
    dropped: str | None = None  # why it is not followed now (looked at again when it changes)
    dropped_seen: tuple[int, int] = (0, 0)  # size, mtime_ns when dropped
    dropped_head: bytes = b""  # csv: the header that had no loss-like column
    db: MlflowDb | None = None  # mlflow_db: the store's reader (rows past its last rowid)
    fresh: bool = False  # read from its start: created (or replaced) in this run, not history
    seen: float = field(default_factory=time.monotonic)  # when it was first found
    attempt: int = 0  # the attempt whose writes its read position reflects (a restart in a later one skips no row)
    stamp: tuple[int, int] | None = None  # mtime_ns, ctime_ns at the last read: a same-size rewrite changes it
    written: bool = False  # bytes of it were read in this run (not only history)
    digest: bytes | None = None  # its head and tail when its stamp last changed with no growth


def set_header(f: FileState, raw: bytes) -> bool:
    names = tuple(n.strip() for n in raw.decode("utf-8", "replace").strip().split(","))
    if not any(canonical_key(n)[0] in ("loss", "val_loss", "grad_norm") for n in names):
        return False
    f.header, f.header_raw = names, raw + b"\n"  # as written: a wider header is no longer a prefix
    return True


def csv_records(f: FileState, lines: list[bytes]) -> list[MetricRecord]:
    out: list[MetricRecord] = []
    source = "file:" + f.path
    for raw in lines:
        if f.header is None:
            if not set_header(f, raw):
                f.dropped, f.dropped_head = "no loss-like column in its header", raw + b"\n"
                return out
            continue
        f.rows += 1
        if f.rows <= f.skip_rows:
            continue
        try:
            [cells] = list(csv.reader(io.StringIO(raw.decode("utf-8", "replace")))) or [[]]
        except (csv.Error, ValueError):  # a garbage row (a bare "\r" in a field): no record, the rest are
            continue
        if len(cells) != len(f.header):
            continue
        values: dict[str, object] = {}
        extra: dict[str, float] = {}
        for name, cell in zip(f.header, cells):
            num = parse_number(cell) if cell else None
            if num is None:
                continue
            canon, per_step = canonical_key(name)
            if canon is not None and per_step:
                values.setdefault(canon, num)
            else:
                extra[name] = num
        rec = make_record(values, "csv", source, None, extra)
        if rec is not None:
            out.append(rec)
    return out


def jsonl_records(f: FileState, lines: list[bytes], source: str, unread: Unread | None = None) -> list[MetricRecord]:
    """``unread``: told of each line that starts like a metric record but gives none (its text, why)."""
    out: list[MetricRecord] = []
    for raw in lines:
        raw = raw.strip()
        if not raw.startswith(b"{"):
            rec = None
        else:
            try:
                obj = json.loads(raw)
            except ValueError:  # {"loss": nan} written with an f-string: Python's spellings read as JSON's
                obj = python_spelled(raw)
            except RecursionError:  # nested deeper than the decoder goes
                obj = None
            rec = record_from_mapping(obj, "jsonl", source, None) if isinstance(obj, dict) else None
            if rec is None and unread is not None:
                text = raw.decode("utf-8", "replace")
                why = unread_reason(text, MAX_RECORD_LINE)
                if why is not None:
                    unread(source, text, why)
                    continue  # a metric line unread, said: no probe miss ("no loss-like key")
        if rec is None:
            if f.metric_lines == 0:
                f.probed += 1
                if f.probed >= JSONL_PROBE_LINES:
                    f.dropped = f"no loss-like key in {JSONL_PROBE_LINES} lines"
                    return out
            continue
        f.metric_lines += 1
        out.append(rec)
    return out


__all__ = ["FileState", "JSONL_PROBE_LINES", "Unread", "csv_records", "jsonl_records", "set_header"]
