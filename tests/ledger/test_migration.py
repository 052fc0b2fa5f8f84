"""Opening a ledger file: a migration is one transaction (issue 24 build 6): a failure (or a kill)
between its two ALTERs leaves the file at its old version with no half-added column, and the next
open migrates it. A file of a newer version, a file that is not a ledger, a locked one: a clear
LedgerError, the file left as it was. (A version 1 file with rows: tests/daemon/test_repeat_memory.py.)"""
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


def test_a_ledger_locked_by_another_process_is_said_plainly(tmp_path: Path) -> None:
    """Another process holds the write lock at start: a LedgerError saying what holds it and what to
    do (after SQLite's busy wait, shortened here from 10 s), not a traceback and not "corrupt"."""
    import subprocess
    import sys

    class Impatient(Ledger):
        BUSY_TIMEOUT_S = 0.3

    sd = tmp_path / "sd"
    Ledger(sd).close()
    holder = subprocess.Popen([sys.executable, "-c", "import sqlite3,sys; db=sqlite3.connect(sys.argv[1], isolation_level=None);"
                               " db.execute('BEGIN IMMEDIATE'); print('held', flush=True); sys.stdin.read()",
                               str(sd / LEDGER_FILE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(LedgerError) as info:
            Impatient(sd)
        msg = str(info.value)
        assert "locked by another process" in msg and "corrupt" not in msg and "Stop that process" in msg
    finally:
        holder.communicate("", timeout=30)


def test_a_huge_argv_is_stored_bounded_and_says_where_it_was_cut(tmp_path: Path) -> None:
    from supervisor.redact import MAX_TOTAL_CHARS as MAX_ARGV_CHARS, MAX_VALUE_CHARS as MAX_ARG_CHARS

    led = Ledger(tmp_path / "sd")
    run, _ = led.open_run("a", {})
    argv = ["python", "train.py", "x" * 5_000_000] + ["--flag"] * 100_000
    led.begin_attempt(run, 0, argv, "/", {}, None, None, None, [], None)
    stored = led.db.execute("SELECT argv_json FROM attempts").fetchone()[0]
    led.close()
    assert len(stored) < 2 * (MAX_ARGV_CHARS + MAX_ARG_CHARS)
    import json

    kept = json.loads(stored)
    assert kept[:2] == ["python", "train.py"] and kept[2].endswith("…(+4998976 chars)")
    assert kept[-1].endswith("more args)")


def test_a_newer_ledger_or_one_that_is_not_a_ledger_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    sd = tmp_path / "sd"
    sd.mkdir()
    path = sd / LEDGER_FILE
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.close()
    before = path.read_bytes()
    for readonly in (False, True):  # the daemon and `history` both
        with pytest.raises(LedgerError, match=f"newer transformer-supervisor .*version {SCHEMA_VERSION + 1}.*upgrade"):
            Ledger(sd, readonly=readonly)
    assert path.read_bytes() == before
    path.write_bytes(b"not a database " * 200)
    for readonly in (False, True):
        with pytest.raises(LedgerError, match="corrupt or not a ledger. Move it aside"):
            Ledger(sd, readonly=readonly)
    assert path.read_bytes() == b"not a database " * 200
