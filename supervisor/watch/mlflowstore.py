"""MLflow's local tracking stores, read with no config and no MLflow import.

A job that reports only to MLflow prints nothing per step; its metrics land in one of MLflow's two
local stores, in the job's working directory by default:

- the SQLite store (``mlflow.db``, MLflow 3's default tracking URI ``sqlite:///mlflow.db``): table
  ``metrics(key, value, timestamp, run_uuid, step, is_nan)``. MLflow stores a NaN as ``value = 0``
  with ``is_nan = 1`` and an infinity as +-``sys.float_info.max`` (SQL has no non-finite floats),
  so both are turned back here. Read read-only through the standard library's ``sqlite3`` (the
  daemon must never take a write lock on the job's database), past the last ``rowid`` read.
- the file store (``mlruns/<experiment>/<run>/metrics/<key>``, ``MLFLOW_TRACKING_URI=file:...``):
  one file per metric key (``train/loss`` is ``metrics/train/loss``), one line per value:
  ``<timestamp ms> <value> <step>``. Read by :mod:`.metricfiles` like any growing file; this
  module turns its lines into records.

Bounds (docs/reliability.md, "Input budgets"): a read takes at most :data:`DB_ROWS_PER_READ` rows and
:data:`DB_READ_BUDGET_S` seconds of SQLite work (a progress handler interrupts the statement), a key
is cut to :data:`KEY_CHARS` characters in SQL (SQLite does not enforce ``VARCHAR(250)``), and a
file-store line over :data:`LINE_CHARS` is skipped. A file that is no SQLite database, a store
without its tables yet, a locked database: one warning each, and the store is tried again when it
changes. Pure Python and the stdlib only.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sqlite3
import sys
import time
from dataclasses import dataclass
from urllib.parse import quote

from ..core.observations import MetricRecord
from ..errors import SupervisorError
from .records import canonical_key, make_record, parse_number

DB_NAMES = frozenset({"mlflow.db"})
DB_ROWS_PER_READ = 5000
DB_READ_BUDGET_S = 1.0
KEY_CHARS = 250
LINE_CHARS = 512
_MAX = sys.float_info.max
_NUMBER = "CASE WHEN typeof({0}) IN ('integer', 'real') THEN {0} END"


class StoreUnreadable(SupervisorError):
    """The store cannot be read now (not a database, no metrics table yet, locked); the message
    says which. The caller warns once and tries again when the file changes."""

    code = "store_unreadable"


def is_file_store_metric(path: str) -> bool:
    """True for ``.../mlruns/<experiment>/<run>/metrics/<key...>`` (a key may hold ``/``)."""
    parts = path.split(os.sep)
    try:
        i = len(parts) - 1 - parts[::-1].index("mlruns")
    except ValueError:
        return False
    return len(parts) >= i + 5 and parts[i + 3] == "metrics"


def file_store_key(path: str) -> str:
    """The metric key of a file-store metric file: its path below ``metrics/``."""
    parts = path.split(os.sep)
    i = len(parts) - 1 - parts[::-1].index("mlruns")
    return "/".join(parts[i + 4:])


def _value(raw: float, is_nan: bool) -> float:
    if is_nan:
        return math.nan
    if raw >= _MAX:
        return math.inf
    if raw <= -_MAX:
        return -math.inf
    return raw


def _record(key: str, value: float, step: int | None, wall_ms: float | None, source: str) -> MetricRecord | None:
    canon, per_step = canonical_key(key)
    if canon is None or not per_step:
        return None  # lr, epoch means, custom keys: no loss-like value, no record
    values: dict[str, object] = {canon: value, "step": step}
    rec = make_record(values, "mlflow", source, None, {})
    if rec is None or wall_ms is None or not math.isfinite(wall_ms):
        return rec
    # The value's own wall time: liveness learns the job's step rhythm from it (a burst of rows read
    # at once is not a burst of steps).
    return dataclasses.replace(rec, at=min(time.time(), wall_ms / 1000.0))


def file_store_records(key: str, lines: list[bytes], source: str) -> list[MetricRecord]:
    """Records of a file-store metric file's complete lines (``<ms> <value> <step>``)."""
    out: list[MetricRecord] = []
    for raw in lines:
        if len(raw) > LINE_CHARS:
            continue
        parts = raw.decode("ascii", "replace").split()
        if len(parts) < 2:
            continue
        value = parse_number(parts[1])
        if value is None:
            continue
        wall = parse_number(parts[0])
        step = parse_number(parts[2]) if len(parts) > 2 else None
        rec = _record(key, value, int(step) if step is not None and math.isfinite(step) else None, wall, source)
        if rec is not None:
            out.append(rec)
    return out


@dataclass
class MlflowDb:
    """One ``mlflow.db``: the rows of its ``metrics`` table past :attr:`last_rowid`."""

    path: str
    last_rowid: int = 0

    def _connect(self) -> sqlite3.Connection:
        # mode=ro: never a write lock on the job's store; a short busy timeout: MLflow's writer holds
        # the lock for milliseconds, and a held lock means "next pass", not a stalled reader thread.
        uri = "file:" + quote(os.path.abspath(self.path)) + "?mode=ro"
        conn = sqlite3.connect(uri, uri=True, timeout=0.05, check_same_thread=False)
        deadline = time.monotonic() + DB_READ_BUDGET_S
        # Every 1,000 VM steps: one step can be costly (a crafted store's 5 MB blob), and the
        # check itself is cheap beside the row reads it interleaves with.
        conn.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0, 1_000)
        return conn

    def _query(self, sql: str, args: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        try:
            conn = self._connect()
        except sqlite3.Error as exc:
            raise StoreUnreadable(f"cannot open it read-only: {exc}") from exc
        try:
            return conn.execute(sql, args).fetchall()
        except sqlite3.OperationalError as exc:
            text = str(exc)
            if "no such table" in text:
                raise StoreUnreadable("no metrics table yet (MLflow creates it at the first run)") from exc
            if "interrupted" in text:
                raise StoreUnreadable(f"a read took over {DB_READ_BUDGET_S} s; tried again later") from exc
            raise StoreUnreadable(text) from exc
        except sqlite3.DatabaseError as exc:
            raise StoreUnreadable(f"not an SQLite database ({exc})") from exc
        finally:
            conn.close()

    def _check_table(self) -> None:
        """``metrics`` must be MLflow's plain table: a view (or a virtual table) could make one
        SELECT materialise and sort anything (a crafted view of 30,000 5 MB blobs took 47 s and
        1.6 GB of temp file before this check)."""
        rows = self._query("SELECT type, substr(sql, 1, 64) FROM sqlite_master WHERE name = 'metrics'")
        if not rows:
            raise StoreUnreadable("no metrics table yet (MLflow creates it at the first run)")
        kind, sql = rows[0]
        if kind != "table" or not isinstance(sql, str) or not sql.upper().startswith("CREATE TABLE"):
            raise StoreUnreadable(f"its 'metrics' is a {kind}, not MLflow's table: not read")

    def skip_history(self) -> None:
        """What the store holds now belongs to earlier runs (or the ended attempt): start after it."""
        self._check_table()
        rows = self._query("SELECT coalesce(max(rowid), 0) FROM metrics")
        top = rows[0][0] if rows else 0
        self.last_rowid = int(top) if isinstance(top, int) else 0

    def read(self, source: str) -> tuple[list[MetricRecord], bool]:
        """The records of the rows added since the last read, and whether more rows wait (a read
        takes :data:`DB_ROWS_PER_READ` at most)."""
        self._check_table()
        # Only numbers leave SQLite (SQLite's columns take any type: a blob in `value` stays there).
        rows = self._query(
            "SELECT rowid, substr(key, 1, ?), " + ", ".join(_NUMBER.format(c) for c in ("value", "timestamp", "step",
                                                                                       "is_nan"))
            + " FROM metrics WHERE rowid > ? ORDER BY rowid LIMIT ?", (KEY_CHARS, self.last_rowid, DB_ROWS_PER_READ))
        out: list[MetricRecord] = []
        for rowid, key, value, wall, step, is_nan in rows:
            self.last_rowid = max(self.last_rowid, int(rowid))  # type: ignore[call-overload]
            if not isinstance(key, str) or not isinstance(value, (int, float)):
                continue
            rec = _record(key, _value(float(value), bool(is_nan)),
                          int(step) if isinstance(step, int) else None,
                          float(wall) if isinstance(wall, (int, float)) else None, source)
            if rec is not None:
                out.append(rec)
        return out, len(rows) >= DB_ROWS_PER_READ


def is_db(name: str) -> bool:
    return name in DB_NAMES


__all__ = ["DB_NAMES", "DB_READ_BUDGET_S", "DB_ROWS_PER_READ", "MlflowDb", "StoreUnreadable",
           "file_store_key", "file_store_records", "is_db", "is_file_store_metric"]
