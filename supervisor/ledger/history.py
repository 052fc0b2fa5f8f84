"""A run as ``history --json`` gives it (the shape SPEC fixes; more fields may be added), read
from the ledger's rows."""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timezone
from typing import Any, Callable, TypeVar

from .errors import LedgerError


def iso(ts: float | None) -> str | None:
    """A recorded wall time as ISO 8601 UTC with milliseconds, as history and status show it."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat(timespec="milliseconds")


def _load(v: str | None) -> Any:
    return None if v is None else json.loads(v)


def repeat_of(r: sqlite3.Row) -> tuple[Any, bool]:
    """(repeat, progressed) of an attempt row; a read-only look at a version 1 file (not
    migrated: an older daemon may still be writing it) has neither column."""
    if "repeat_json" not in r.keys():
        return None, False
    return _load(r["repeat_json"]), bool(r["progressed"])


def history_of(db: Any, run_id: str | None) -> dict[str, Any]:
    """Run ``run_id`` of the ledger connection ``db``: the run, its attempts oldest first, its
    events in the order they were written. A ledger without runs gives an empty history.

    Each part is read on its own: a part the ledger cannot give (a garbled page: LedgerError) is
    left empty and named in ``unreadable`` (its error), and the other parts are still given."""
    if run_id is None:
        return {"run_id": None, "attempts": [], "events": []}
    unreadable: dict[str, str] = {}
    run = _part(unreadable, "run", lambda: db.execute("SELECT * FROM runs WHERE run_id=?", (run_id,)).fetchone())
    attempts = _part(unreadable, "attempts", lambda: _attempts(db, run_id)) or []
    events = _part(unreadable, "events", lambda: [
        {"at": iso(e["at"]), "attempt": e["attempt"], "event": e["event"], "level": e["level"],
         "message": e["message"], "data": _load(e["data_json"])}
        for e in db.execute("SELECT * FROM events WHERE run_id=? ORDER BY id", (run_id,))]) or []
    h = {
        "run_id": run_id,
        "name": run["name"] if run else None,
        "state": run["state"] if run else None,
        "exit_code": run["exit_code"] if run else None,
        "reason": run["reason"] if run else None,
        "attempts": attempts,
        "events": events,
    }
    if unreadable:
        h["unreadable"] = unreadable
    return h


T = TypeVar("T")


def _part(unreadable: dict[str, str], name: str, read: Callable[[], T]) -> T | None:
    try:
        return read()
    except LedgerError as e:
        unreadable[name] = e.message
        return None


def _attempts(db: Any, run_id: str) -> list[dict[str, Any]]:
    attempts = []
    for r in db.execute("SELECT * FROM attempts WHERE run_id=? ORDER BY attempt", (run_id,)):
        detection = _load(r["detection_json"])
        attempts.append({
            "attempt": r["attempt"],
            "argv": json.loads(r["argv_json"]),
            "cwd": r["cwd"],
            "started_at": iso(r["started_at"]),
            "ended_at": iso(r["ended_at"]),
            "exit_code": r["exit_code"],
            "signal": r["signal"],
            "cause": r["cause"],
            "action": r["action"],
            "checkpoint": r["checkpoint"],
            "resume_step": r["resume_step"],
            "remedies": json.loads(r["remedies_json"] or "[]"),
            "validation": _load(r["validation_json"]),
            "detection": detection,
            # torchrun's failing rank, exception and last frame (job/torchelastic.py), or null
            "root_cause": ((detection or {}).get("details") or {}).get("root_cause"),
            "decision": _load(r["decision_json"]),
            "gate": _load(r["gate_json"]),
            "shutdown": _load(r["shutdown_json"]),
            "summary": r["summary"],
            "env": json.loads(r["env_json"]),
            "environment": _load(r["snapshot_json"]),
            # [job] prewarm: "used" or "cold: <why>" (null when prewarm is off)
            "prewarm": (_load(r["snapshot_json"]) or {}).get("prewarm"),
            "counted": bool(r["counted"]),
            "repeat": repeat_of(r)[0],
        })
    return attempts
