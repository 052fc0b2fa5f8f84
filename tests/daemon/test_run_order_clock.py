"""Runs are ordered by the ledger's sequence (rowid), never by wall time (issue 24 build 1): a
clock stepped back between two daemon lives continues the unfinished run instead of starting a
second one. The clock is injected; no real clock changes."""
from __future__ import annotations

from pathlib import Path

from supervisor.ledger.store import Ledger


class _Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_a_clock_stepped_back_continues_the_unfinished_run(tmp_path: Path) -> None:
    clock = _Clock(2_000_000_000.0)
    led = Ledger(tmp_path, clock=clock)
    first, _ = led.open_run("job", {})
    led.end_run(first, "finished", 0, "done")
    clock.t -= 7 * 24 * 3600  # the wall clock steps back a week before the next daemon life
    second, continued = led.open_run("job", {})
    assert not continued and second != first
    led.close()
    clock.t += 3600  # the daemon dies; the next life reads the same stepped-back clock
    again = Ledger(tmp_path, clock=clock)
    run_id, continued = again.open_run("job", {})
    assert (run_id, continued) == (second, True), "the unfinished run is the newest, whatever created_at says"
    assert again.latest_run_id() == second
    rows = again.db.execute("SELECT run_id, created_at FROM runs ORDER BY rowid").fetchall()
    assert [r["run_id"] for r in rows] == [first, second] and rows[1]["created_at"] < rows[0]["created_at"]
    again.close()
