"""Repeat identities in the ledger (issue 11): a restarted daemon still knows what each failure
looked like. The real-daemon test is tests/e2e/test_core_e2e.py::
test_an_identical_failure_is_remembered_across_a_daemon_restart."""
from __future__ import annotations

import sqlite3

from supervisor.core.policy import RepeatKey
from supervisor.daemon.recovery import repeat_key
from supervisor.ledger.schema import LEDGER_FILE, SCHEMA, SCHEMA_VERSION
from supervisor.ledger.store import Ledger


def test_a_version_1_ledger_gains_the_repeat_columns_and_keeps_its_rows(tmp_path):
    sd = tmp_path / "sd"
    sd.mkdir()
    db = sqlite3.connect(sd / LEDGER_FILE)
    db.executescript(SCHEMA)
    db.execute("INSERT INTO runs(run_id, name, created_at, state) VALUES ('r', 'n', 1, 'running')")
    db.execute("INSERT INTO attempts(run_id, attempt, argv_json, cwd, env_json, started_at, ended_at, cause) "
               "VALUES ('r', 0, '[]', '/', '{}', 1, 2, 'crash')")
    db.execute("PRAGMA user_version=1")
    db.commit()
    db.close()
    led = Ledger(sd)
    assert led.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
    old = led.attempts("r")[0]
    assert old.cause == "crash" and old.repeat is None and old.progressed is False
    key = RepeatKey("/ck/ckpt.pt", 40, "abcd", 44, "exit 1")
    led.begin_attempt("r", 1, ["python"], "/", {}, None, "/ck/ckpt.pt", 40, [], None)
    led.end_attempt("r", 1, exit_code=1, signal=None, cause="crash", action="restart", summary="x",
                    repeat=key.__dict__, progressed=True)
    led.close()
    again = Ledger(sd).attempts("r")[1]  # reopened: the migration does not run twice
    assert repeat_key(again.repeat) == key and again.progressed is True


def test_a_repeat_row_of_another_shape_claims_no_repeat():
    assert repeat_key(None) is None
    assert repeat_key({"checkpoint": None}) is None
    assert repeat_key(["x"]) is None
    assert repeat_key({"checkpoint": None, "resume_step": None, "launch": "l", "step": None,
                       "detail": "exit 1"}) == RepeatKey(None, None, "l", None, "exit 1")


def test_a_version_1_ledger_read_only_is_not_migrated_and_still_reads(tmp_path):
    sd = tmp_path / "sd"
    sd.mkdir()
    db = sqlite3.connect(sd / LEDGER_FILE)
    db.executescript(SCHEMA)
    db.execute("INSERT INTO runs(run_id, name, created_at, state) VALUES ('r', 'n', 1, 'running')")
    db.execute("INSERT INTO attempts(run_id, attempt, argv_json, cwd, env_json, started_at, ended_at, cause) "
               "VALUES ('r', 0, '[]', '/', '{}', 1, 2, 'crash')")
    db.execute("PRAGMA user_version=1")
    db.commit()
    db.close()
    led = Ledger(sd, readonly=True)  # `history` beside an older daemon that may still write it
    assert led.attempts("r")[0].repeat is None
    assert led.history("r")["attempts"][0]["repeat"] is None
    assert led.db.execute("PRAGMA user_version").fetchone()[0] == 1
