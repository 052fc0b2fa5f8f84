"""Ledger writes that meet another process's lock (issue 34 part 7): the writer waits at most
WRITE_WAIT_S, keeps the write with the time it was made at, in order with the writes after it,
and a thread of its own writes them once the lock is gone; a lock still held at close is counted
and said (ledger_write_failed). The lock is real: a second SQLite connection in BEGIN EXCLUSIVE."""
from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import pytest
from structlog.testing import capture_logs

from supervisor.ledger import deferred
from supervisor.ledger.schema import LEDGER_FILE
from supervisor.ledger.store import Ledger
from tests.util import wait_for


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def lock(sd: Path) -> sqlite3.Connection:
    other = sqlite3.connect(sd / LEDGER_FILE, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    return other


def said(logs: Sequence[Mapping[str, Any]], event: str) -> list[Mapping[str, Any]]:
    return [line for line in logs if line["event"] == event]


def test_writes_under_a_lock_wait_briefly_then_go_in_in_order_with_their_own_times(tmp_path: Path) -> None:
    sd, clock = tmp_path / "sd", Clock()
    led = Ledger(sd, clock=clock)
    run, _ = led.open_run("job", {})
    other = lock(sd)
    with capture_logs() as logs:
        t0 = time.monotonic()
        for i in range(50):
            clock.t = 1000.0 + i
            led.event(run, None, "line", "info", f"m{i}", {"i": i})
        led.end_run(run, "stopped", 0, "stopped on request")
        spent = time.monotonic() - t0
        # One write waited for the lock (WRITE_WAIT_S); the 50 behind it waited in memory. The
        # bound is loose for a loaded machine and far below the 10 s per write it was.
        assert spent < 10 * deferred.WRITE_WAIT_S + 2.0, spent
        assert led.deferred is not None and led.deferred.waiting == 51
        assert led.write_errors == 0  # kept, not dropped
        other.rollback()
        other.close()
        wait_for(lambda: led.deferred is not None and led.deferred.waiting == 0, timeout=30)
    events = led.history(run)["events"]
    assert [e["data"]["i"] for e in events] == list(range(50))
    assert [e["at"][17:19] for e in events][:3] == ["40", "41", "42"]  # 1000 s + i: the times they were made at
    assert led.history(run)["state"] == "stopped"
    delayed = said(logs, "ledger_write_delayed")
    assert len(delayed) == 1 and "locked by another process" in delayed[0]["message"]
    assert said(logs, "ledger_write_recovered")[0]["delayed"] == 51
    assert not said(logs, "ledger_write_failed")
    led.close()


def test_a_lock_still_held_at_close_is_counted_and_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deferred, "CLOSE_WAIT_S", 0.3)
    sd = tmp_path / "sd"
    led = Ledger(sd)
    run, _ = led.open_run("job", {})
    other = lock(sd)
    with capture_logs() as logs:
        for i in range(3):
            led.event(run, None, "line", "info", f"m{i}")
        led.close()
    other.rollback()
    other.close()
    assert led.write_errors == 3
    failed = said(logs, "ledger_write_failed")
    assert len(failed) == 1 and "when the daemon exited" in failed[0]["error"]


def test_past_the_bound_a_waiting_write_is_dropped_counted_and_said(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deferred, "MAX_WAITING", 5)
    sd = tmp_path / "sd"
    led = Ledger(sd)
    run, _ = led.open_run("job", {})
    other = lock(sd)
    with capture_logs() as logs:
        for i in range(8):
            led.event(run, None, "line", "info", f"m{i}", {"i": i})
        assert led.deferred is not None and led.deferred.waiting == 5 and led.write_errors == 3
        other.rollback()
        other.close()
        wait_for(lambda: led.deferred is not None and led.deferred.waiting == 0, timeout=30)
    assert [e["data"]["i"] for e in led.history(run)["events"]] == [0, 1, 2, 3, 4]  # the first ones, in order
    failed = said(logs, "ledger_write_failed")
    assert len(failed) == 1 and "already wait for it" in failed[0]["error"]
    led.close()
