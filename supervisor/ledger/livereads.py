"""The live page's reads of the ledger (``ops/livedata.py``), each bounded, on a read-only
connection of its own (``Ledger(readonly=True)``): the metric rows added since the last read (by
rowid, so a poll never reads the whole series again) and the newest events."""

from __future__ import annotations

from typing import Any

#: Metric rows read in one poll at most: a backlog (the page opened on a long run) is read over
#: several polls, each a bounded piece, never the whole series at once.
METRIC_ROWS_PER_READ = 20_000


def metric_rows_after(db: Any, run_id: str, rowid: int, limit: int = METRIC_ROWS_PER_READ) -> list[tuple[int, float, int, float, int]]:
    """``(rowid, at, step, loss, attempt)`` of the run's rows with a step and a loss after
    ``rowid``, oldest first, at most ``limit``."""
    # "+run_id": not through the run_id index (it would visit every row of the run, sorted after,
    # at each poll) but the rowid range: only the rows added since the last read.
    rows = db.execute("SELECT rowid, at, step, loss, attempt FROM metrics WHERE rowid > ? AND +run_id = ? "
                      "AND step IS NOT NULL AND loss IS NOT NULL ORDER BY rowid LIMIT ?",
                      (rowid, run_id, limit)).fetchall()
    return [(int(r[0]), float(r[1]), int(r[2]), float(r[3]), int(r[4])) for r in rows]


def recent_events(db: Any, run_id: str, limit: int) -> list[dict[str, Any]]:
    """The run's ``limit`` newest events, newest first: when, attempt, name, level, message (the
    message as the ledger keeps it, masked when written; the caller cuts and masks again)."""
    rows = db.execute("SELECT at, attempt, event, level, message FROM events WHERE run_id = ? "
                      "ORDER BY id DESC LIMIT ?", (run_id, limit)).fetchall()
    return [{"at": r[0], "attempt": r[1], "event": r[2], "level": r[3], "message": r[4]} for r in rows]
