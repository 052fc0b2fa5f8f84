"""`status` and `history` for people: where the checkpoints were found, how the job resumes, and
a resume the job ignored."""
from __future__ import annotations

from supervisor.cli.render import render_history, status_table


def test_status_says_where_the_checkpoint_dir_was_found_and_how_the_job_resumes() -> None:
    text = status_table({
        "state": "running",
        "checkpoint_dir": {"path": "/srv/out", "found_by": "--output_dir in the command"},
        "resume": {"args": ["--resume_from_checkpoint", "{checkpoint}"], "source": "inferred",
                   "note": "inferred --resume_from_checkpoint for an HF Trainer script (t.py); set job.resume_args "
                           "to override"},
        "resume_ignored": {"attempt": 1, "resume_step": 20, "first_step": 1, "checkpoint": "/srv/out/checkpoint-20"},
    })
    assert "checkpoint dir  /srv/out  (found by --output_dir in the command)" in text
    assert "resume          --resume_from_checkpoint {checkpoint}  (inferred --resume_from_checkpoint" in text
    assert "resume ignored  attempt 1: resumed from step 20, first step 1" in text


def test_status_while_nothing_is_known_and_when_configured() -> None:
    text = status_table({"checkpoint_dir": {"path": None, "found_by": None, "looking_under": ["/w"]},
                         "resume": {"args": [], "source": None, "note": "no way: set --resume-arg=..."}})
    assert "(not known yet: watching /w for checkpoints)" in text and "no way: set --resume-arg=..." in text
    text = status_table({"checkpoint_dir": {"path": "/c", "found_by": "config"}, "resume_ignored": None})
    assert "/c  (configured)" in text and "resume ignored" not in text


def test_history_gives_the_reason_of_a_failed_validation() -> None:
    h = {"run_id": "r", "name": "n", "state": "finished", "exit_code": 0, "attempts": [
        {"attempt": 1, "started_at": "2026-01-01T00:00:00.000", "ended_at": None, "exit_code": None, "signal": None,
         "cause": None, "action": None, "checkpoint": "/c/checkpoint-10",
         "validation": {"verdict": "fail", "summary": "failed: resume_ignored: the job was resumed from step 10"}}]}
    assert "validation: fail (failed: resume_ignored: the job was resumed from step 10)" in render_history(h)
