"""A ledger that cannot be written (a full disk) never takes the daemon down: every dropped write is
counted, the failure is said once per episode, reads go on, and the end of the episode says how
many records were lost. The full disk is SQLite's own: ``PRAGMA max_page_count`` at the file's
size makes every write that needs a page fail with SQLITE_FULL, as a full filesystem does."""
from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any, MutableMapping

import pytest
from structlog.testing import capture_logs

from supervisor.ledger.schema import LEDGER_FILE
from supervisor.ledger.store import Ledger, LedgerError
from supervisor.ledger.writeguard import RECOVERED_AFTER_S


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _fill_disk(led: Ledger) -> None:
    pages = led.db.execute("PRAGMA page_count").fetchone()[0]
    led.db.execute(f"PRAGMA max_page_count={pages}")


def _free_disk(led: Ledger) -> None:
    led.db.execute("PRAGMA max_page_count=1000000")


def _said(logs: list[MutableMapping[str, Any]], event: str) -> list[MutableMapping[str, Any]]:
    return [line for line in logs if line["event"] == event]


def test_a_full_disk_drops_and_counts_writes_says_so_once_and_the_end_says_how_many_were_lost(tmp_path: Path) -> None:
    mono = Clock()
    led = Ledger(tmp_path / "sd", monotonic=mono)
    run, _ = led.open_run("job", {})
    led.begin_attempt(run, 0, ["python", "train.py"], "/", {}, None, None, None, [], None)
    _fill_disk(led)
    tried = 40
    with capture_logs() as logs:
        for i in range(tried):  # 4 kB each: the free room of the last pages is soon gone
            assert led.event(run, 0, "line", "info", "x" * 4000, {"i": i}) is None
        led.metrics_batch(run, 0, [(1.0 * i, i, 1.0, None, None, None) for i in range(500)])
    kept = [e["data"]["i"] for e in led.history(run)["events"]]
    assert 0 < led.write_errors, "the disk never filled"
    assert led.write_errors == (tried - len(kept)) + 1, "every record dropped is counted (the metrics batch too)"
    assert kept == list(range(len(kept))), "the rows that fit are kept, in order"
    failed = _said(logs, "ledger_write_failed")
    assert len(failed) == 1 and "full" in failed[0]["error"] and "supervision continues" in failed[0]["message"]
    assert led.failing is not None and "full" in led.failing
    # Reads go on: the daemon still numbers its attempts and answers `history`
    assert led.next_attempt_number(run) == 1 and led.attempts(run)[0].attempt == 0

    lost = led.write_errors
    _free_disk(led)
    with capture_logs() as logs:
        led.event(run, 0, "after", "info", "written")
        mono.t += RECOVERED_AFTER_S / 2
        _fill_disk(led)  # a nearly full disk: small writes pass between failures, one episode
        led.event(run, 0, "big", "info", "y" * 50_000)
        _free_disk(led)
        lost += 1
        led.event(run, 0, "after", "info", "written")
        mono.t += RECOVERED_AFTER_S - 1
        led.event(run, 0, "after", "info", "written, the episode still open")
        assert _said(logs, "ledger_write_failed") == [] and _said(logs, "ledger_write_recovered") == []
        assert led.failing is not None
        mono.t += 2
        led.event(run, 0, "after", "info", f"{RECOVERED_AFTER_S} s of writes without a failure")
    recovered = _said(logs, "ledger_write_recovered")
    assert len(recovered) == 1 and recovered[0]["lost"] == lost == led.write_errors
    assert f"{lost} record(s) were lost" in recovered[0]["message"]
    assert led.failing is None
    assert [e["event"] for e in led.history(run)["events"]][-4:] == ["after"] * 4
    led.close()


def test_writes_on_a_closed_connection_from_two_threads_are_counted_and_said_once(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "sd")
    run, _ = led.open_run("job", {})
    led.close()
    errors: list[BaseException] = []

    def write() -> None:
        try:
            for _ in range(200):
                led.event(run, None, "e", "info", "m")
                led.update_attempt(run, 0, last_step=1)
        except BaseException as e:  # the test's point: nothing may reach the caller
            errors.append(e)

    with capture_logs() as logs:
        threads = [threading.Thread(target=write) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not errors and not any(t.is_alive() for t in threads)
    assert led.write_errors == 800
    assert len(_said(logs, "ledger_write_failed")) == 1


def test_a_full_disk_at_open_is_said_as_a_full_disk_not_as_a_corrupt_ledger(tmp_path: Path) -> None:
    """SQLite says SQLITE_FULL for the schema's first page; the user is told to free space, not
    to move a sound ledger aside as corrupt."""

    class FullDisk(Ledger):
        def _connect(self) -> sqlite3.Connection:
            db = super()._connect()
            db.execute("PRAGMA max_page_count=1")
            return db

    with pytest.raises(LedgerError) as info:
        FullDisk(tmp_path / "sd")
    msg = str(info.value)
    assert "disk holding it is full" in msg and "Free space" in msg and "corrupt" not in msg
    assert (tmp_path / "sd" / LEDGER_FILE).exists(), "left as it was"


def test_a_full_disk_when_the_run_is_opened_is_a_ledger_error_not_a_raw_sqlite_one(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "sd")
    _fill_disk(led)
    with pytest.raises(LedgerError, match="disk holding it is full"):
        led.open_run("job", {"job": {"command": ["x" * 20_000]}})  # a config larger than a page
    _free_disk(led)
    run, continued = led.open_run("job", {"job": {"command": ["x" * 20_000]}})
    assert not continued and led.latest_run_id() == run
    led.close()
