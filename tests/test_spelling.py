"""One spelling of a value in every output: the console's compact line, the logfmt line and the
journal's fields say ``passed=true`` and ``["python","train.py"]``, never Python's ``True`` or a
repr; the demo's summary and the report's words use the same spelling."""

from __future__ import annotations

import enum
import io
import re
import shlex
from pathlib import Path

import structlog

from supervisor import logsetup
from supervisor.events import Cause
from supervisor.humanize import durations_by, value
from supervisor.narration import compact
from supervisor.ops.journal import entry_fields, field_name


class Plain(enum.Enum):  # an enum that is not a str: its value, never "Plain.X"
    X = "x"


EVENT = {"event": "loadtest_checked", "level": "info", "passed": True, "finite": False, "cause": Cause.NAN,
         "kind": Plain.X, "argv": ["python", "train.py"], "lost": {"crash": 9.3}, "loss": float("nan"),
         "step": 12, "dir": Path("/ckpt"), "keys": ("w", "b")}


def _pairs(text: str) -> dict[str, str]:
    """logfmt's key=value pairs (a value with quotes or spaces is quoted and escaped)."""
    return dict(tok.split("=", 1) for tok in shlex.split(text) if "=" in tok)


def test_console_logfmt_and_journal_spell_each_value_alike() -> None:
    line = compact(EVENT)  # "   loadtest_checked (passed=true finite=false ...)"
    console = dict(re.findall(r"(\w+)=(\S+)", line[line.index("(") + 1:line.rindex(")")]))  # as printed
    logfmt = _pairs(logsetup.logfmt_line(EVENT))
    journal = entry_fields(EVENT, "m")
    want = {"passed": "true", "finite": "false", "cause": "nan", "kind": "x", "argv": '["python","train.py"]',
            "lost": '{"crash":9.3}', "loss": "nan", "step": "12", "dir": "/ckpt", "keys": '["w","b"]'}
    for key, spelled in want.items():
        assert console[key] == logfmt[key] == journal[field_name(key)] == value(EVENT[key]) == spelled, key
    assert not re.search(r"True|False|Plain\.|'", line + logsetup.logfmt_line(EVENT)), line


def test_the_console_renderer_says_true_not_True() -> None:
    out = io.StringIO()
    logsetup.configure("console", "debug", out)
    try:
        structlog.get_logger("t").info("loadtest_checked", passed=True, argv=["python", "x.py"])
    finally:
        structlog.reset_defaults()
    said = out.getvalue()
    assert "passed=true" in said and 'argv=["python","x.py"]' in said and "True" not in said, said


def test_durations_by_cause_in_words_and_units() -> None:
    assert durations_by({"crash": 9.34, "nan": 74.2, "hang": 0}) == "nan 1 min 14 s, crash 9.3 s, hang 0.0 s"
    assert durations_by({}) == ""


def test_status_and_history_spell_values_the_same_way() -> None:
    from supervisor.cli.render import render_history, status_table

    table = status_table({"state": "running", "daemon": False, "linger": True})
    assert re.search(r"^daemon +false$", table, re.M) and re.search(r"^linger +true$", table, re.M), table
    hist = render_history({"run_id": "r", "name": "n", "state": "finished", "attempts": [
        {"attempt": 0, "started_at": "2026-01-01T00:00:00", "ended_at": None, "exit_code": None, "signal": None,
         "cause": None, "action": None, "checkpoint": None, "remedies": [{"env": {"LR_SCALE": "0.5"}}],
         "validation": {"passed": True}, "prewarm": {"used": True}}]})
    assert 'remedies: [{"env":{"LR_SCALE":"0.5"}}]' in hist and 'prewarm: {"used":true}' in hist, hist
    assert 'validation: {"passed":true}' in hist and "True" not in hist and "'" not in hist, hist


def test_a_hook_commands_environment_says_true_not_True() -> None:
    from supervisor.ops.alertmsg import Alert, Masker

    alert = Alert("end_weights_checked", "info", "m", "job", "r1", "host", 0, 0.0,
                  data={"finite": True, "restarted": False, "nonfinite": ["w"]})
    env = alert.env(Masker.of({}))
    assert env["TSUP_NOTIFY_FINITE"] == "true" and env["TSUP_NOTIFY_RESTARTED"] == "false", env
    assert "TSUP_NOTIFY_NONFINITE" not in env  # lists stay in the JSON payload on stdin
