"""The ledger's store on a real SQLite file: runs opened, continued and ended, attempts numbered
and recorded, events and metrics kept in order, and the run read back in the shape `history
--json` gives (SPEC). No daemon: the Ledger alone, with an injected wall clock."""
from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from supervisor import strictjson
from supervisor.ledger.store import Ledger, LedgerError

T0 = 1_900_000_000.0


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _begin(led: Ledger, run: str, attempt: int, argv: list[str] | None = None, **kw: Any) -> None:
    args: dict[str, Any] = {"env": {}, "snapshot": None, "checkpoint": None, "resume_step": None, "remedies": [],
                            "gate": None} | kw
    led.begin_attempt(run, attempt, argv or ["python", "train.py"], "/work", **args)


def test_a_run_is_opened_then_continued_by_the_next_daemon_with_its_new_config(tmp_path: Path) -> None:
    sd = tmp_path / "sd"
    led = Ledger(sd, clock=Clock())
    run, continued = led.open_run("job", {"job": {"name": "job"}, "restarts": {"max": 3}})
    assert not continued and led.latest_run_id() == run
    assert led.run_config(run) == {"job": {"name": "job"}, "restarts": {"max": 3}}
    assert led.history()["state"] == "running" and led.history()["name"] == "job"
    led.close()  # the daemon is killed: no end_run
    again = Ledger(sd, clock=Clock(T0 + 60))
    assert again.open_run("job", {"restarts": {"max": 5}}) == (run, True)
    assert again.run_config(run) == {"restarts": {"max": 5}}, "the config it continues with replaces the old one"
    assert again.run_config("no-such-run") == {}
    again.close()


@pytest.mark.parametrize("state, code, continued", [("finished", 0, False), ("gave_up", 3, False),
                                                     ("stopped", 143, True)])
def test_a_run_ends_in_its_state_and_only_a_stopped_one_is_continued(tmp_path: Path, state: str, code: int,
                                                                      continued: bool) -> None:
    """SPEC: 143 means "requeue me": the requeued daemon continues the stopped run; after finished
    or gave_up the next daemon starts a new run."""
    sd, clock = tmp_path / "sd", Clock()
    led = Ledger(sd, clock=clock)
    run, _ = led.open_run("job", {})
    clock.t += 100
    led.end_run(run, state, code, f"ended: {state}")
    row = led.db.execute("SELECT * FROM runs WHERE run_id=?", (run,)).fetchone()
    assert (row["state"], row["exit_code"], row["reason"], row["ended_at"]) == (state, code, f"ended: {state}", T0 + 100)
    led.close()
    again = Ledger(sd, clock=clock)
    run2, cont = again.open_run("job", {})
    assert cont is continued and (run2 == run) is continued
    h = again.history()
    assert (h["run_id"], h["state"], h["exit_code"], h["reason"]) == (run2, "running", None, None)
    if not continued:  # the ended run keeps its end
        assert again.history(run)["state"] == state
    again.close()


def test_attempts_are_numbered_per_run_recorded_and_ended(tmp_path: Path) -> None:
    clock = Clock()
    led = Ledger(tmp_path / "sd", clock=clock)
    run, _ = led.open_run("job", {})
    assert led.next_attempt_number(run) == 0
    _begin(led, run, 0, checkpoint=None, gate={"passed": True})
    led.set_attempt_process(run, 0, 4242, 4242, 123.5)
    led.update_attempt(run, 0, first_step_at=T0 + 5, last_step=40, validation_json={"passed": True})
    clock.t += 60
    led.end_attempt(run, 0, exit_code=None, signal="SIGKILL", cause="oom", action="restart",
                    summary="out of memory", detection={"cause": "oom", "details": {}},
                    repeat={"cause": "oom", "step": 40}, progressed=True)
    assert led.next_attempt_number(run) == 1
    _begin(led, run, 1, checkpoint="/ck/step-40.pt", resume_step=40, remedies=[{"env": {"BS": "8"}}])
    first, second = led.attempts(run)
    assert (first.attempt, first.pid, first.pgid, first.leader_ctime) == (0, 4242, 4242, 123.5)
    assert (first.started_at, first.ended_at, first.signal, first.cause, first.action) == (T0, T0 + 60, "SIGKILL",
                                                                                           "oom", "restart")
    assert first.counted and first.progressed and first.repeat == {"cause": "oom", "step": 40}
    assert (second.attempt, second.checkpoint, second.resume_step, second.ended_at) == (1, "/ck/step-40.pt", 40, None)
    row = led.db.execute("SELECT first_step_at, last_step, validation_json FROM attempts WHERE attempt=0").fetchone()
    assert (row[0], row[1], json.loads(row[2])) == (T0 + 5, 40, {"passed": True})
    # A manual restart is not counted; the count lives in the row
    led.end_attempt(run, 1, exit_code=0, signal=None, cause="manual", action="restart", summary="restart", counted=False)
    assert not led.attempts(run)[1].counted
    led.update_attempt(run, 1)  # nothing to set: no statement, no failure
    led.end_run(run, "finished", 0, "done")
    other, _ = led.open_run("job", {})
    assert led.next_attempt_number(other) == 0 and led.attempts(other) == []
    led.close()


def test_events_keep_the_order_they_were_written_in_even_when_the_clock_steps_back(tmp_path: Path) -> None:
    clock = Clock()
    led = Ledger(tmp_path / "sd", clock=clock)
    run, _ = led.open_run("job", {})
    led.event(run, None, "daemon_started", "info", "supervising")
    clock.t -= 3600  # NTP steps the clock back an hour
    led.event(run, 0, "job_started", "info", "attempt 0", {"pid": 7, "loss": math.nan, "path": Path("/x")})
    led.event(run, 0, "job_exited", "warning", None)
    h = led.history(run)
    assert [e["event"] for e in h["events"]] == ["daemon_started", "job_started", "job_exited"]
    assert [e["attempt"] for e in h["events"]] == [None, 0, 0]
    assert h["events"][1]["at"] < h["events"][0]["at"], "wall times are recorded as read"
    assert h["events"][1]["data"] == {"pid": 7, "loss": "NaN", "path": "/x"}  # strict JSON: NaN as a string
    assert h["events"][2]["message"] is None and h["events"][2]["level"] == "warning"
    led.end_run(run, "finished", 0, "done")
    other, _ = led.open_run("job", {})
    led.event(other, None, "daemon_started", "info", "the next run")
    assert [e["event"] for e in led.history(run)["events"]] == ["daemon_started", "job_started", "job_exited"]
    led.close()


def test_metrics_keep_non_finite_values_and_recent_step_times_are_bounded(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "sd")
    run, _ = led.open_run("job", {})
    led.metrics_batch(run, 0, [(T0 + 1, 1, 2.5, 0.1, 1000.0, None), (T0 + 2, 2, math.nan, math.inf, -math.inf, None),
                               (T0 + 3, None, None, None, None, 1.25)])
    led.metrics_batch(run, 0, [])  # an empty batch writes nothing and does not fail
    led.metrics_batch(run, 1, [(T0 + 10 + i, 10 + i, 1.0, None, None, None) for i in range(20)])
    rows = list(led.metrics(run))
    assert len(rows) == 23 and led.write_errors == 0
    assert [r["at"] for r in rows] == sorted(r["at"] for r in rows)
    assert tuple(rows[0])[2:] == (T0 + 1, 1, 2.5, 0.1, 1000.0, None)
    nan_row = rows[1]
    assert nan_row["loss"] is None, "a NaN is stored as NULL (SQLite's own rule for a bound NaN)"
    assert nan_row["grad_norm"] == math.inf and nan_row["tokens_per_sec"] == -math.inf
    assert rows[2]["step"] is None and rows[2]["val_loss"] == 1.25
    # Only records with a step, the newest `limit` of them, oldest first
    assert led.recent_step_times(run, limit=5) == [T0 + 10 + i for i in range(15, 20)]
    assert led.recent_step_times(run) == [T0 + 1, T0 + 2] + [T0 + 10 + i for i in range(20)]
    assert list(led.metrics("another-run")) == []
    led.close()


def test_the_failure_record_counts_failures_run_time_and_relaunch_delays(tmp_path: Path) -> None:
    clock = Clock()
    led = Ledger(tmp_path / "sd", clock=clock)
    run, _ = led.open_run("job", {})
    ends = [("crash", True), ("manual", True), ("oom", False), (None, True)]
    for n, (cause, counted) in enumerate(ends):
        clock.t = T0 + 1000 * n
        _begin(led, run, n)
        if n > 0:
            led.update_attempt(run, n, first_step_at=clock.t + 7 * n)
        clock.t += 100
        led.end_attempt(run, n, exit_code=1, signal=None, cause=cause, action="restart", summary="", counted=counted)
    clock.t = T0 + 9000
    _begin(led, run, 4)  # still running: no run time yet, no first step
    ran, failures, restarts = led.failure_record()
    assert ran == pytest.approx(400.0)
    assert failures == 1, "a manual restart, a failure not counted and a clean exit are not failures"
    assert restarts == pytest.approx([7.0, 14.0, 21.0])
    led.close()


def test_history_has_the_shape_spec_gives_and_is_strict_json(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "sd", clock=Clock())
    assert led.history() == {"run_id": None, "attempts": [], "events": []}
    run, _ = led.open_run("job", {})
    argv = ["torchrun", "--nproc-per-node=2", "train.py", "--lr", "3e-4"]
    for n in (0, 1):
        _begin(led, run, n, argv=argv, env={"TSUP_ATTEMPT": str(n)}, snapshot={"prewarm": "used", "gpus": []},
               checkpoint="/ck/a.pt" if n else None, remedies=[{"args": ["--lr", "1e-4"]}] if n else [])
    led.update_attempt(run, 0, validation_json={"passed": False, "loss": math.inf})
    led.end_attempt(run, 0, exit_code=1, signal=None, cause="crash", action="restart", summary="exit 1",
                    detection={"cause": "crash", "details": {"root_cause": {"rank": 1}}},
                    decision={"action": "restart"}, shutdown={"style": "graceful"})
    led.event(run, 0, "job_exited", "warning", "exit 1", {"code": 1})
    h = led.history()
    assert {"run_id", "attempts", "events"} <= h.keys() and h["run_id"] == run
    spec: dict[str, type | tuple[type, ...]] = {"attempt": int, "argv": list, "cwd": str, "started_at": str, "ended_at": (str, type(None)),
            "exit_code": (int, type(None)), "signal": (str, type(None)), "cause": (str, type(None)),
            "action": (str, type(None)), "checkpoint": (str, type(None)), "remedies": list,
            "validation": (dict, type(None))}
    assert [a["attempt"] for a in h["attempts"]] == [0, 1], "attempts oldest first"
    for a in h["attempts"]:
        for key, kind in spec.items():
            assert isinstance(a[key], kind), (key, a[key])
        assert a["argv"] == argv, "argv is exactly what was exec'd"
        assert a["started_at"] == "2030-03-17T17:46:40.000+00:00"
    first, second = h["attempts"]
    assert (first["cause"], first["exit_code"], first["root_cause"], first["prewarm"]) == ("crash", 1, {"rank": 1}, "used")
    assert first["validation"] == {"passed": False, "loss": "Infinity"}
    assert (second["ended_at"], second["checkpoint"], second["remedies"]) == (None, "/ck/a.pt", [{"args": ["--lr", "1e-4"]}])
    assert second["env"] == {"TSUP_ATTEMPT": "1"} and second["repeat"] is None
    text = strictjson.dumps(h)

    def bare(token: str) -> Any:
        raise AssertionError(f"bare {token} in history --json")

    assert json.loads(text, parse_constant=bare) == json.loads(json.dumps(h))
    led.close()


def test_a_reader_sees_the_writers_rows_and_cannot_write(tmp_path: Path) -> None:
    sd = tmp_path / "sd"
    with pytest.raises(FileNotFoundError, match="no run has used this state dir"):
        Ledger(sd, readonly=True)
    led = Ledger(sd)
    run, _ = led.open_run("job", {})
    led.event(run, None, "daemon_started", "info", "up")
    reader = Ledger(sd, readonly=True)  # `history` beside a live daemon (WAL: no lock taken)
    assert [e["event"] for e in reader.history()["events"]] == ["daemon_started"]
    led.event(run, None, "later", "info", "seen by the open reader too")
    assert len(reader.history()["events"]) == 2
    reader.event(run, None, "x", "info", "a reader's write is refused and counted, not raised")
    assert reader.write_errors == 1 and len(led.history()["events"]) == 2
    reader.close()
    led.close()


def test_a_step_beyond_sqlites_64_bit_integers_keeps_its_row_and_raises_nothing(tmp_path: Path) -> None:
    """A checkpoint named step_20241204183000123456.pt, a manifest's or a job line's 20-digit step:
    sqlite3 raises OverflowError binding it. Kept as a REAL instead: the attempt row is not lost."""
    huge = 20241204183000123456
    led = Ledger(tmp_path / "sd")
    run, _ = led.open_run("job", {})
    _begin(led, run, 0, checkpoint="/ck/step_20241204183000123456.pt", resume_step=huge)
    led.update_attempt(run, 0, last_step=-huge, resume_step=2**64)
    led.event(run, 0, "resumed", "info", "from a huge step", {"step": huge})
    [row] = led.attempts(run)
    assert row.resume_step == float(2**64) and row.checkpoint == "/ck/step_20241204183000123456.pt"
    assert led.db.execute("SELECT last_step FROM attempts").fetchone()[0] == float(-huge)
    assert led.history(run)["events"][0]["data"] == {"step": huge}, "JSON keeps it exactly"
    assert led.write_errors == 0
    _begin(led, run, 1, resume_step=2**63 - 1)  # the largest INTEGER stays an exact INTEGER
    assert led.attempts(run)[1].resume_step == 2**63 - 1
    led.close()


def test_text_with_undecodable_bytes_keeps_its_row_and_shows_the_bytes(tmp_path: Path) -> None:
    """A checkpoint file named in Latin-1 (os.listdir gives its bytes as surrogates), a lone
    surrogate from a job's JSON: sqlite3 cannot encode either as UTF-8 and raised
    UnicodeEncodeError. The row is kept, the bytes shown as escapes."""
    import os

    name = os.fsdecode(b"step_100_\xe9t\xe9.pt")
    led = Ledger(tmp_path / "sd")
    run, _ = led.open_run("job", {})
    _begin(led, run, 0, checkpoint=f"/ck/{name}", resume_step=100)
    led.event(run, 0, "resuming", "info", f"resuming from /ck/{name}", {"path": f"/ck/{name}"})
    led.end_attempt(run, 0, exit_code=1, signal=None, cause="crash", action="restart", summary="bad \ud800 text")
    [attempt] = led.history(run)["attempts"]
    assert attempt["checkpoint"] == "/ck/step_100_\\xe9t\\xe9.pt" and attempt["summary"] == "bad \\ud800 text"
    [event] = led.history(run)["events"]
    assert event["message"] == "resuming from /ck/step_100_\\xe9t\\xe9.pt" and event["data"] == {"path": f"/ck/{name}"}
    assert led.write_errors == 0
    led.close()


def test_a_reader_between_the_files_creation_and_its_tables_sees_no_run_yet(tmp_path: Path) -> None:
    # A daemon creates ledger.sqlite, then its tables: `history` at that moment (or a test
    # polling it) reads an empty history, not "no such table: runs".
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "ledger.sqlite").touch(mode=0o600)
    led = Ledger(tmp_path, readonly=True)
    try:
        assert led.latest_run_id() is None
        assert led.history(None) == {"run_id": None, "attempts": [], "events": []}
        # A named run, its attempts and metrics: not there yet either, no error.
        assert led.history("20261204-000000-abcdef")["attempts"] == []
        assert led.attempts("20261204-000000-abcdef") == [] and list(led.metrics("x")) == []
    finally:
        led.close()
    # The reader kept nothing open on the file and wrote nothing into it: the daemon makes it next.
    assert (tmp_path / "ledger.sqlite").stat().st_size == 0
    made = Ledger(tmp_path)
    made.close()


def test_a_file_with_other_tables_is_no_ledger_and_says_so(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "ledger.sqlite")
    db.execute("CREATE TABLE notes (t TEXT)")
    db.commit()
    db.close()
    with pytest.raises(LedgerError, match=r"cannot be read \(an SQLite file with the tables notes, none of a "
                       r"ledger's\): it is corrupt or not a ledger"):
        Ledger(tmp_path, readonly=True)
