"""Repeat identities in the ledger (issue 11): a restarted daemon still knows what each failure
looked like. The real-daemon test is tests/e2e/test_core_e2e.py::
test_an_identical_failure_is_remembered_across_a_daemon_restart."""
from __future__ import annotations

import sqlite3

from supervisor.core.policy import RepeatKey
from supervisor.daemon.recovery import repeat_key
from supervisor.ledger.schema import LEDGER_FILE, SCHEMA, SCHEMA_VERSION
from supervisor.ledger.store import Ledger


def _version_1_ledger(tmp_path):
    """A state dir whose ledger a version 1 daemon wrote: run 'r' with one ended attempt."""
    sd = tmp_path / "sd"
    sd.mkdir()
    db = sqlite3.connect(sd / LEDGER_FILE)
    db.executescript(SCHEMA)  # the base schema is version 1's; MIGRATIONS[1] adds the repeat columns
    db.execute("INSERT INTO runs(run_id, name, created_at, state) VALUES ('r', 'n', 1, 'running')")
    db.execute("INSERT INTO attempts(run_id, attempt, argv_json, cwd, env_json, started_at, ended_at, cause) "
               "VALUES ('r', 0, '[]', '/', '{}', 1, 2, 'crash')")
    db.execute("PRAGMA user_version=1")
    db.commit()
    db.close()
    return sd


def test_a_version_1_ledger_gains_the_repeat_columns_and_keeps_its_rows(tmp_path):
    sd = _version_1_ledger(tmp_path)
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
    sd = _version_1_ledger(tmp_path)
    led = Ledger(sd, readonly=True)  # `history` beside an older daemon that may still write it
    assert led.attempts("r")[0].repeat is None
    assert led.history("r")["attempts"][0]["repeat"] is None
    assert led.db.execute("PRAGMA user_version").fetchone()[0] == 1


def test_an_ended_attempt_carries_its_repeat_identity_and_a_rebooted_machine_gives_up_on_it():
    from supervisor.core.causes import Cause
    from supervisor.core.machine import State
    from supervisor.core.messages import Boot, EndAttempt, FirstMetric, Prepared, Resume, Spawned
    from supervisor.core.policy import PastAttempt
    from tests.core.test_machine import W0, Script, one

    s = Script(policy={"backoff_initial_s": 10, "backoff_jitter": 0})
    s.running()
    s.detect(Cause.NAN, step=44)
    end = one(s.stopped(), EndAttempt)
    assert end.repeat is not None and end.repeat.step == 44 and end.progressed
    # What the ledger gives a restarted daemon: attempt 0 as it ended, attempt 1 cut short by the restart.
    s2 = Script(policy={"backoff_initial_s": 10, "backoff_jitter": 0})
    s2(Boot(next_attempt=2, history=[PastAttempt(0, Cause.NAN, W0, 30.0, True, end.progressed, end.repeat),
                                     PastAttempt(1, None, W0 + 40, 5.0, False)]))
    s2(Prepared(resume=Resume(None, None, "fresh")))
    s2(Spawned(10, 10, ["python", "train.py"], s2.now))
    s2(FirstMetric())
    s2.detect(Cause.NAN, step=45)
    s2.stopped()
    assert s2.m.state is State.GAVE_UP and "identical to attempt 0" in s2.m.exit_reason
