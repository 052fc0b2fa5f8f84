"""A ledger migration is one transaction (issue 24 build 6): a failure (or a kill) between its two
ALTERs leaves the file at its old version with no half-added column, and the next open migrates it."""
from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from supervisor.ledger import schema
from supervisor.ledger.schema import LEDGER_FILE, SCHEMA, SCHEMA_VERSION
from supervisor.ledger.store import Ledger, LedgerError


def _columns(path: Path) -> set[str]:
    db = sqlite3.connect(path)
    try:
        return {r[1] for r in db.execute("PRAGMA table_info(attempts)")}
    finally:
        db.close()


def test_a_migration_that_fails_between_its_alters_leaves_the_old_version_whole(tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    sd = tmp_path / "sd"
    sd.mkdir()
    path = sd / LEDGER_FILE
    db = sqlite3.connect(path)
    db.executescript(SCHEMA)
    db.execute("PRAGMA user_version=1")
    db.close()
    first = schema.MIGRATIONS[1].split(";")[0] + ";"
    monkeypatch.setitem(schema.MIGRATIONS, 1, first + "\nALTER TABLE no_such_table ADD COLUMN x TEXT;")
    with pytest.raises(LedgerError):
        Ledger(sd)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 1
    db.close()
    assert "repeat_json" not in _columns(path)  # the first ALTER was rolled back with the second
    monkeypatch.undo()
    led = Ledger(sd)
    assert led.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    led.close()
    assert {"repeat_json", "progressed"} <= _columns(path)
