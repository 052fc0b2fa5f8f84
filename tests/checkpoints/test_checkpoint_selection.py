"""Selection (pure) and the book of bad checkpoints / attempts without progress."""
from __future__ import annotations

from pathlib import Path

from supervisor.checkpoints.quicklist import Readiness
from supervisor.checkpoints.selection import CheckpointBook, select, select_explained


def row(step: int | None, ready: bool = True, reasons: tuple[str, ...] = ()) -> Readiness:
    return Readiness(path=Path(f"/ck/step_{step}.pt"), step=step, layout="file", exists=True, complete=True,
                     sha256_ok=True, config_matches=True, config_diff={}, val_metric=None, load_test=None,
                     ready=ready, reasons=reasons or (() if ready else ("load test failed",)))


ROWS = [row(1500), row(1000, ready=False), row(800), row(500), row(None)]


def test_restart_takes_the_newest_ready() -> None:
    c = select(ROWS, mode="restart", onset_step=None, margin_steps=0, bad=set())
    assert c is not None and c.step == 1500 and "last known good" in c.reason


def test_rollback_takes_the_newest_ready_before_onset_minus_margin() -> None:
    c = select(ROWS, mode="rollback", onset_step=1200, margin_steps=0, bad=set())
    assert c is not None and c.step == 800
    assert ("/ck/step_1500.pt", "step 1500 is not before 1200") in c.skipped
    c2 = select(ROWS, mode="rollback", onset_step=1200, margin_steps=400, bad=set())
    assert c2 is not None and c2.step == 500
    c3 = select(ROWS, mode="rollback", onset_step=800, margin_steps=0, bad=set())
    assert c3 is not None and c3.step == 500, "a checkpoint at the onset step itself is not before it"


def test_bad_ones_are_skipped_and_none_has_a_reason() -> None:
    c = select(ROWS, mode="restart", onset_step=None, margin_steps=0, bad={Path("/ck/step_1500.pt")})
    assert c is not None and c.step == 800
    none, why = select_explained(ROWS, mode="rollback", onset_step=100, margin_steps=0, bad=set())
    assert none is None and "step < 100" in why
    assert select_explained([], mode="restart", onset_step=None, margin_steps=0, bad=set()) == (None, "no checkpoints found")


def test_load_error_marks_bad_at_once_and_persists(tmp_path: Path) -> None:
    book = CheckpointBook(tmp_path)
    assert book.note_attempt_result("/ck/a.pt", "checkpoint_load_error", False) is True
    assert CheckpointBook(tmp_path).is_bad("/ck/a.pt")
    assert "failed to load" in (CheckpointBook(tmp_path).bad_reason("/ck/a.pt") or "")


def test_same_cause_twice_without_a_newer_checkpoint_marks_bad(tmp_path: Path) -> None:
    book = CheckpointBook(tmp_path, bad_after_same_cause=2)
    assert book.note_attempt_result("/ck/b.pt", "nan", False) is False
    assert book.note_attempt_result("/ck/b.pt", "nan", True) is False  # it progressed: not bad
    assert book.note_attempt_result("/ck/b.pt", "nan", False) is False
    assert book.note_attempt_result("/ck/b.pt", "oom", False) is False  # a different cause
    assert book.note_attempt_result("/ck/b.pt", "oom", False) is True
    assert book.is_bad("/ck/b.pt") and not book.is_bad("/ck/c.pt")


def test_attempts_without_progress(tmp_path: Path) -> None:
    book = CheckpointBook(tmp_path)
    book.note_attempt_result("/ck/a.pt", "crash", True, step=100)
    for s in (200, 200, 200):
        book.note_attempt_result("/ck/x.pt", "crash" if s else None, False, step=s)
    assert book.attempts_without_progress() == 3 and book.no_progress(3) and not book.no_progress(4)
    assert book.steps_seen() == [200, 200, 200]


def test_unreadable_book_starts_afresh(tmp_path: Path) -> None:
    (tmp_path / CheckpointBook.FILE).write_text("{garbage")
    book = CheckpointBook(tmp_path)
    assert not book.is_bad("/x") and book.attempts_without_progress() == 0
    assert list(tmp_path.glob("checkpoint_book.corrupt-*")), "the unreadable file is kept aside, not deleted"
