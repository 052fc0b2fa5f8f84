"""One SQLite connection shared by the daemon's threads: every statement runs under one lock, and
a query's rows are fetched before the lock is let go."""

from __future__ import annotations

import sqlite3
import threading
from typing import Any, Iterator, Sequence

# SQLite's INTEGER is 64-bit; Python's sqlite3 raises OverflowError binding a larger int. Steps come
# from the job's lines, checkpoint names and manifests (a "step" of 20 digits is one regex match
# away), and a raise there would lose the row and reach the daemon: such a value is kept as a REAL.
_INT64 = range(-(2**63), 2**63)


def storable(params: Sequence[Any]) -> Sequence[Any]:
    """``params`` with every int SQLite cannot hold as an INTEGER turned into a float (a REAL)."""
    if any(type(v) is int and v not in _INT64 for v in params):
        return tuple(float(v) if type(v) is int and v not in _INT64 else v for v in params)
    return params


class LockedConnection:
    """A sqlite3 connection whose execute/executemany/executescript run under one lock."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        with self._lock:
            cur = self._conn.execute(sql, storable(params))
            return _Fetched(cur.fetchall(), cur) if cur.description else cur  # type: ignore[return-value]

    def executemany(self, *a: Any) -> sqlite3.Cursor:
        with self._lock:
            return self._conn.executemany(*a)

    def executescript(self, script: str) -> sqlite3.Cursor:
        with self._lock:
            return self._conn.executescript(script)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def move_to(self, new: sqlite3.Connection, *, copy: bool) -> None:
        """From now on run on ``new`` (a fresh file); ``copy``: first copy every page the current
        connection still reads into it (SQLite's online backup). Under the lock, so no statement
        of another thread lands in the old file after the copy. The old connection is closed;
        on a failed copy ``new`` is closed and this one is left as it was."""
        with self._lock:
            if copy:
                try:
                    self._conn.backup(new)
                except BaseException:
                    new.close()
                    raise
            old, self._conn = self._conn, new
            new.row_factory = old.row_factory
            try:
                old.close()
            except sqlite3.Error:
                pass  # its file is gone; nothing is left to flush into it

    @property
    def row_factory(self) -> Any:
        return self._conn.row_factory

    @row_factory.setter
    def row_factory(self, v: Any) -> None:
        self._conn.row_factory = v


class _Fetched:
    """Rows fetched while holding the lock, offering the cursor methods the ledger uses."""

    def __init__(self, rows: list[Any], cur: sqlite3.Cursor) -> None:
        self._rows = rows

    def fetchone(self) -> Any:
        return self._rows[0] if self._rows else None

    def fetchall(self) -> list[Any]:
        return self._rows

    def __iter__(self) -> Iterator[Any]:
        return iter(self._rows)
