"""The one narration (supervisor/narration.py): the demo's sentences for the daemon's events, a
compact line for the others, and logfmt's list/dict values as JSON."""
from __future__ import annotations

import io
import json
import shlex

import pytest
import structlog

from supervisor import logsetup
from supervisor.narration import ConsoleRenderer, compact, console_text, narrate, stamp


def test_detection_says_evidence_onset_and_decision():
    text = narrate({"event": "failure_detected", "cause": "nan", "step": 120, "onset_step": 111,
                    "source": "stdout", "evidence": "step 120 loss nan",
                    "message": "attempt 0 failing: nan at step 120: loss is nan; rollback to step 100 in 1.0 s"})
    assert text == ("!! detected nan at step 120 (began at step 111; seen in stdout)\n"
                    "   evidence: step 120 loss nan\n   decision: rollback to step 100 in 1.0 s")


def test_detection_without_step_or_evidence():
    text = narrate({"event": "failure_detected", "cause": "crash", "source": "exit", "message": "x; restart now"})
    assert text == "!! detected crash (seen in exit)\n   decision: restart now"


@pytest.mark.parametrize("ed, said", [
    ({"event": "job_started", "attempt": 0}, ">> attempt 0 launched, from scratch"),
    ({"event": "job_started", "attempt": 2, "checkpoint": "/c/step_000100.pt", "resume_step": 100},
     ">> attempt 2 launched, resuming from step 100 (step_000100.pt)"),
    ({"event": "checkpoint_chosen", "path": "/c/step_000100.pt", "step": 100, "reason": "newest verified"},
     "ok verified step_000100.pt (step 100): newest verified"),
    ({"event": "checkpoint_quarantined", "path": "/c/step_2.pt", "reason": "bad zip", "dest": "/c/quarantine"},
     "xx checkpoint step_2.pt failed verification (bad zip); moved to /c/quarantine (never deleted)"),
    ({"event": "checkpoint_none_ready", "reason": "all 3 failed verification"},
     "!! no ready checkpoint: all 3 failed verification"),
    ({"event": "validation_started", "message": "validating 20 steps"}, "   validating 20 steps"),
    ({"event": "validation_passed", "message": "validation passed"}, "ok validation passed"),
    ({"event": "validation_failed", "message": "loss off"}, "!! loss off"),
    ({"event": "restart_scheduled", "message": "rollback 1/10 in 0 s"}, "   rollback 1/10 in 0 s"),
    ({"event": "gave_up", "message": "restart budget spent"}, "XX restart budget spent"),
    ({"event": "daemon_exiting", "message": "exit 0"}, "== exit 0"),
    ({"event": "detection_warned", "message": "slow"}, "   (warning only) slow"),
    ({"event": "runner_tick_failed", "message": "boom"}, "!! internal: boom"),
])
def test_each_narrated_event(ed, said):
    assert narrate(ed) == said


def test_unnarrated_events_are_not_narrated_but_still_said_compactly():
    assert narrate({"event": "checkpoint_none_ready", "reason": "no checkpoints found in /c"}) is None
    assert narrate({"event": "gave_up"}) is None  # the runner's twin with a message says it
    assert compact({"event": "daemon_started", "level": "info", "message": "supervising run r1"}) == \
        "   daemon_started: supervising run r1"
    assert compact({"event": "state_changed", "old": "running", "new": "stopping", "why": "nan"}) == \
        "   state running -> stopping (nan)"
    line = compact({"event": "gate_passed", "level": "warning", "summary": "gate passed", "next": "launching",
                    "warnings": ["no GPU"], "waited_s": 0.0, "run_id": "r1"})
    assert line == '!! gate_passed: gate passed; launching (warnings=["no GPU"] waited_s=0.0)'
    assert compact({"event": "x", "argv": ["a" * 200]}).endswith('...)') and len(compact({"event": "x",
                                                                                           "argv": ["a" * 200]})) < 140


def test_stamp_indents_continuations_and_a_traceback_goes_below():
    assert stamp("00:17", "!! a\n   b") == "[00:17] !! a\n           b"
    text = console_text({"event": "concern_failed", "message": "m", "exception": "Traceback\nKeyError\n"})
    assert text == "!! internal: m\nTraceback\nKeyError"
    assert ConsoleRenderer()(None, "", {"event": "job_started", "attempt": 1, "ts": "12:00:00"}) == \
        "[12:00:00] >> attempt 1 launched, from scratch"


@pytest.fixture
def configured():
    def make(fmt: str) -> io.StringIO:
        out = io.StringIO()
        logsetup.configure(fmt, "info", out)
        return out

    yield make
    structlog.reset_defaults()


def test_logfmt_list_and_dict_values_are_json(configured, monkeypatch):
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    out = configured("logfmt")
    structlog.get_logger("t").info("job_started", argv=["python", "train.py", "--lr 3e-4"], env={"A": 1})
    fields = dict(kv.split("=", 1) for kv in shlex.split(out.getvalue().strip()))
    assert json.loads(fields["argv"]) == ["python", "train.py", "--lr 3e-4"]
    assert json.loads(fields["env"]) == {"A": 1}
    assert "['python'" not in out.getvalue()


def test_console_format_narrates(configured):
    out = configured("console")
    structlog.get_logger("t").warning("failure_detected", cause="nan", step=5, source="stdout", evidence="loss nan",
                                      message="attempt 0 failing: nan: loss is nan; rollback now")
    lines = out.getvalue().splitlines()
    assert lines[0].endswith("] !! detected nan at step 5 (seen in stdout)")
    assert lines[1].strip() == "evidence: loss nan" and lines[2].strip() == "decision: rollback now"
