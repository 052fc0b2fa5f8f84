"""The daemon's ledger checkpoints its WAL on a thread of its own (ledger/walcheckpoint.py): the
writer's connection never does, the thread's rounds copy the WAL into the file, a retake is
followed, nothing is created at a missing path, and a failing thread hands the checkpoints back
to the writer."""
from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from supervisor.ledger import walcheckpoint
from supervisor.ledger.schema import LEDGER_FILE
from supervisor.ledger.store import Ledger
from supervisor.ledger.walcheckpoint import WalCheckpointer
from supervisor.ownpaths import file_identity
from tests.util import wait_for

# Past SQLite's default auto-checkpoint (1000 pages of 4 KiB): the writer would have checkpointed.
ROWS = 60_000


def _write(led: Ledger, run: str, rows: int = ROWS) -> None:
    for start in range(0, rows, 2000):
        led.metrics_batch(run, 0, [(float(i), i, 1.5, 0.25, 1000.0, None) for i in range(start, start + 2000)])


def _autocheckpoint(led: Ledger) -> int:
    return int(led.db.execute("PRAGMA wal_autocheckpoint").fetchone()[0])


def _wal(sd: Path) -> int:
    wal = sd / f"{LEDGER_FILE}-wal"
    return wal.stat().st_size if wal.exists() else 0


def _daemons_ledger(sd: Path, monkeypatch, interval_s: float) -> tuple[Ledger, str]:
    """A ledger as the daemon opens it: a run, checkpoints on the thread every ``interval_s``
    (3600: none of the thread's own; the test calls ``round``)."""
    monkeypatch.setattr(Ledger, "CHECKPOINT_INTERVAL_S", interval_s)
    led = Ledger(sd)
    run, _ = led.open_run("job", {})
    led.checkpoint_in_background()
    return led, run


def test_the_writer_never_checkpoints_and_a_round_copies_the_wal_into_the_file(tmp_path: Path, monkeypatch) -> None:
    sd = tmp_path / "sd"
    led, run = _daemons_ledger(sd, monkeypatch, 3600.0)
    assert _autocheckpoint(led) == 0
    before = (sd / LEDGER_FILE).stat().st_size
    _write(led, run)
    assert (sd / LEDGER_FILE).stat().st_size == before  # every row still only in the WAL
    assert _wal(sd) > 1000 * 4096
    checkpointer = led._checkpointer
    assert checkpointer is not None
    done = checkpointer.round()
    assert done.skipped is None and done.frames > 1000 and done.copied == done.frames
    assert (sd / LEDGER_FILE).stat().st_size > before
    grown = _wal(sd)
    _write(led, run, 2000)  # the next write starts the WAL again from its beginning
    assert _wal(sd) <= grown
    led.close()
    assert not (sd / f"{LEDGER_FILE}-wal").exists()  # the writer's close was the last one
    reader = Ledger(sd, readonly=True)
    assert reader.db.execute("SELECT count(*) FROM metrics").fetchone()[0] == ROWS + 2000
    reader.close()


def test_the_thread_keeps_the_file_up_to_date_while_the_daemon_writes(tmp_path: Path, monkeypatch) -> None:
    sd = tmp_path / "sd"
    led, run = _daemons_ledger(sd, monkeypatch, 0.05)
    before = (sd / LEDGER_FILE).stat().st_size
    _write(led, run)
    wait_for(lambda: (sd / LEDGER_FILE).stat().st_size > before, 30, what="the thread's checkpoint")
    thread = [t for t in threading.enumerate() if t.name == "ledger-checkpoint"]
    assert thread and thread[0].daemon
    led.close()
    assert not thread[0].is_alive()


def test_a_deleted_ledger_is_never_created_by_a_round_and_its_retake_is_followed(tmp_path: Path, monkeypatch) -> None:
    sd = tmp_path / "sd"
    led, run = _daemons_ledger(sd, monkeypatch, 3600.0)
    checkpointer = led._checkpointer
    assert checkpointer is not None
    _write(led, run, 4000)
    assert checkpointer.round().copied > 0
    for name in (LEDGER_FILE, f"{LEDGER_FILE}-wal", f"{LEDGER_FILE}-shm"):
        (sd / name).unlink(missing_ok=True)
    _write(led, run, 4000)  # into the deleted file, through the writer's open handle
    assert checkpointer.round().skipped is not None
    assert not (sd / LEDGER_FILE).exists()  # mode=rw: nothing made at the path
    assert "nothing lost" in led.retake(run, "job", {})
    assert _autocheckpoint(led) == 0  # the retake's new connection leaves checkpoints to the thread
    _write(led, run, 40_000)
    done = checkpointer.round()
    assert done.skipped is None and done.copied == done.frames > 0
    led.close()
    reader = Ledger(sd, readonly=True)
    assert reader.db.execute("SELECT count(*) FROM metrics").fetchone()[0] == 48_000
    reader.close()


def test_a_failing_checkpoint_thread_hands_the_checkpoints_back_to_the_writer(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(Ledger, "CHECKPOINT_INTERVAL_S", 0.01)

    def broken(self: WalCheckpointer) -> walcheckpoint.Round:
        raise RuntimeError("a defect in the round")

    monkeypatch.setattr(WalCheckpointer, "round", broken)
    sd = tmp_path / "sd"
    led = Ledger(sd)
    led.open_run("job", {})
    with capture_logs() as said:
        led.checkpoint_in_background()
        wait_for(lambda: led._checkpointer is None, 30, what="the fallback")
    assert _autocheckpoint(led) == 1000
    assert [e["reason"] for e in said if e["event"] == "ledger_checkpoint_fallback"] == [
        "the checkpoint thread failed: RuntimeError: a defect in the round"]
    led.close()


def test_rounds_that_keep_failing_end_in_the_fallback(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(walcheckpoint, "GIVE_UP_AFTER", 3)
    notes = tmp_path / "notes.db"
    notes.write_text("not a database, at the path the checkpointer was given")
    fell_back: list[bool] = []
    c = WalCheckpointer(notes, lambda: file_identity(notes), lambda: fell_back.append(True), interval_s=0.01)
    with pytest.raises(sqlite3.DatabaseError):
        c.round()
    c.start()
    wait_for(lambda: fell_back, 30, what="the fallback after 3 failed rounds")
    c.stop()
    assert fell_back == [True] and c.failed_rounds == 3
    assert notes.read_text() == "not a database, at the path the checkpointer was given"
