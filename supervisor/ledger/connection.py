"""One SQLite connection shared by the daemon's threads: every statement runs under one lock, and
a query's rows are fetched before the lock is let go."""

from __future__ import annotations

import sqlite3
import threading
from typing import Any, Callable, Iterator, Sequence

_INT64 = range(-(2**63), 2**63)


def storable(params: Sequence[Any]) -> tuple[Any, ...]:
    """``params`` as values sqlite3 can bind, for a statement whose binding failed; a raise there
    would lose the row and reach the daemon. SQLite's INTEGER is 64-bit: steps come from the job's
    lines, checkpoint names and manifests (a 20-digit "step" is one regex match away), so a larger
    int is kept as a REAL. Text must be UTF-8: a path read from a directory holds its undecodable
    bytes as surrogates (a checkpoint file named in Latin-1), so those bytes are kept as ``\\xNN``."""
    return tuple(_storable(v) for v in params)


def _storable(v: Any) -> Any:
    if type(v) is int and v not in _INT64:
        return float(v)
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            try:
                return v.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            except UnicodeEncodeError:  # a lone surrogate that stands for no byte: kept as \uDNNN
                return v.encode("utf-8", "backslashreplace").decode("utf-8")
    return v


class LockedConnection:
    """A sqlite3 connection whose execute/executescript run under one lock."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        with self._lock:
            try:
                cur = self._conn.execute(sql, params)
            except (OverflowError, UnicodeEncodeError):  # the binding failed: nothing was run
                cur = self._conn.execute(sql, storable(params))
            return _Fetched(cur.fetchall(), cur) if cur.description else cur  # type: ignore[return-value]

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


class CheckedReads:
    """A read-only connection whose queries fetch their rows at once and turn an SQLite error
    (a page garbled on disk, the file locked past the busy wait) into ``translate(e)``: the CLI's
    readers catch one error kind that says what is wrong and what to do."""

    def __init__(self, conn: sqlite3.Connection, translate: Callable[[sqlite3.Error], Exception]) -> None:
        self._conn = conn
        self._translate = translate

    def execute(self, sql: str, params: Sequence[Any] = ()) -> _Fetched:
        try:
            cur = self._conn.execute(sql, params)
            # Fetched here: a garbled page deep in a table raises while rows are read, not at execute.
            return _Fetched(cur.fetchall() if cur.description else [], cur)
        except sqlite3.Error as e:
            raise self._translate(e) from None

    def close(self) -> None:
        self._conn.close()

    @property
    def row_factory(self) -> Any:
        return self._conn.row_factory

    @row_factory.setter
    def row_factory(self, v: Any) -> None:
        self._conn.row_factory = v
