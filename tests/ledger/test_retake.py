"""Ledger.retake beside tests/daemon/test_state_dir_retake.py (the deleted-dir copy and the fresh
start): nothing to do while the file is in place, a file put at its name is moved aside and kept,
and a reader never moves anything."""
from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.ledger.schema import LEDGER_FILE
from supervisor.ledger.store import Ledger, LedgerError


def test_a_ledger_still_in_place_is_left_alone(tmp_path: Path) -> None:
    sd = tmp_path / "sd"
    led = Ledger(sd)
    run, _ = led.open_run("job", {})
    led.event(run, None, "before", "info", "kept")
    inode = (sd / LEDGER_FILE).stat().st_ino
    (sd / "control.sock.gone").touch()  # other files of the dir may come and go
    assert led.retake(run, "job", {}) == "the ledger was still in place"
    led.event(run, None, "after", "info", "same file")
    assert (sd / LEDGER_FILE).stat().st_ino == inode
    assert [e["event"] for e in led.history(run)["events"]] == ["before", "after"]
    led.close()


def test_a_file_put_at_the_ledgers_name_is_moved_aside_and_the_rows_are_copied(tmp_path: Path) -> None:
    sd = tmp_path / "sd"
    led = Ledger(sd)
    run, _ = led.open_run("job", {})
    led.event(run, None, "before", "info", "kept")
    (sd / LEDGER_FILE).unlink()
    (sd / LEDGER_FILE).write_text("someone's notes")  # put there by hand: never overwritten
    said = led.retake(run, "job", {})
    assert "nothing lost" in said and "moved aside" in said
    aside = [p for p in sd.iterdir() if p.name.startswith(f"{LEDGER_FILE}.found-")]
    assert len(aside) == 1 and aside[0].read_text() == "someone's notes" and aside[0].name in said
    led.event(run, None, "after", "info", "in the new file")
    led.close()
    reader = Ledger(sd, readonly=True)
    assert [e["event"] for e in reader.history(run)["events"]] == ["before", "after"]
    reader.close()


def test_a_reader_is_never_moved(tmp_path: Path) -> None:
    sd = tmp_path / "sd"
    Ledger(sd).close()
    reader = Ledger(sd, readonly=True)
    with pytest.raises(LedgerError, match="read-only ledger is never moved"):
        reader.retake("r", "job", {})
    reader.close()


def test_two_files_found_in_the_same_second_are_both_kept(tmp_path: Path) -> None:
    sd = tmp_path / "sd"
    led = Ledger(sd, clock=lambda: 1_900_000_000.0)  # every retake in the same second
    run, _ = led.open_run("job", {})
    for n in (1, 2):
        (sd / LEDGER_FILE).unlink()
        (sd / LEDGER_FILE).write_text(f"notes {n}")
        assert "moved aside" in led.retake(run, "job", {})
    aside = sorted(p.name for p in sd.iterdir() if ".found-" in p.name)
    assert aside == [f"{LEDGER_FILE}.found-1900000000", f"{LEDGER_FILE}.found-1900000000-1"]
    assert {(sd / a).read_text() for a in aside} == {"notes 1", "notes 2"}
    led.close()
