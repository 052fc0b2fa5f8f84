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


# The one escaper (supervisor/textescape.py): bidi controls and every other invisible or control
# character of a job's text as a visible escape, in each of its three modes.
BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"


def test_the_escaped_set_is_every_control_format_surrogate_and_separator_but_the_joiners() -> None:
    import sys
    import unicodedata

    from supervisor.textescape import escape

    keep = {"\u200c", "\u200d"}  # scripts and emoji need them to be drawn right
    for n in range(sys.maxunicode + 1):
        c = chr(n)
        cat = unicodedata.category(c)
        unsafe = cat in ("Cc", "Cf", "Cs", "Zl", "Zp") and c not in keep
        # The set is Unicode 15's: a format character newer than this Python's tables reads as unassigned.
        assert (escape(c) != c) == unsafe or (cat == "Cn" and escape(c) != c), f"U+{n:04X} {cat}"


def test_each_mode_escapes_bidi_controls_visibly_and_keeps_printable_text() -> None:
    from supervisor.textescape import Mode, escape, escaped

    for c in BIDI:
        for mode in Mode:
            assert escape(f"step 10 {c}loss 2.3", mode) == f"step 10 \\u{ord(c):04x}loss 2.3", (mode, c)
    line = "step 10 loss 2.31 ✓ 3.1 µs/tok 👨\u200d👩\u200d👧 شبكة"
    assert all(escape(line, mode) is line for mode in Mode)  # nothing to do: the same object
    assert escape("a\nb\r\tc\x1b[2J\x85\u2028\U000e0041\udc80") == "a\\nb\\r\\tc\\x1b[2J\\x85\\u2028\\U000e0041\\udc80"
    assert escape("a\nb\x1b[2J\u202e", Mode.FIELD) == "a\nb\\x1b[2J\\u202e"  # its renderer writes "\n" itself
    # A terminal's view: sequences dropped, a redrawn line its last drawing, then every line one line.
    assert escape("\x1b[31mred\x1b[0m 10%\r 20%\u202e\n\x1b]0;title\x07x", Mode.TERMINAL) == " 20%\\u202e\\nx"
    assert escaped(3) == "3" and escaped(f"train{BIDI[4]}.log") == "train\\u202e.log"


def test_the_console_the_logfmt_line_and_the_journal_entry_escape_a_jobs_bidi_controls(configured, monkeypatch):
    from supervisor.ops.journal import entry_fields

    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    sample = "step 10 \u202eloss 2.3\u202c \u2066x\u2069"
    for fmt in ("console", "logfmt", "json"):
        out = configured(fmt)
        structlog.get_logger("t").warning("metrics_blind", message=f"samples:\n  | {sample}", samples=[sample],
                                          evidence=sample)
        said = out.getvalue()
        assert not any(c in said for c in BIDI) and "\\u202e" in said, (fmt, said)
    fields = entry_fields({"event": "metrics_blind", "message": f"samples:\n  | {sample}", "evidence": sample})
    assert fields["MESSAGE"] == "samples:\n  | step 10 \\u202eloss 2.3\\u202c \\u2066x\\u2069"
    assert not any(c in v for v in fields.values() for c in BIDI)
