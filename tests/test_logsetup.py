"""The daemon's own log lines: a traceback survives in every format, one timestamp key, no None."""
from __future__ import annotations

import io
import json
import re

import pytest
import structlog

from supervisor import logsetup


@pytest.fixture
def configured():
    def make(fmt: str) -> io.StringIO:
        out = io.StringIO()
        logsetup.configure(fmt, "info", out)
        return out

    yield make
    structlog.reset_defaults()


def _fail(message: str = "the main loop raised") -> None:
    log = structlog.get_logger("t")
    try:
        {"present": 1}["missing"]
    except KeyError:
        log.exception("runner_tick_failed", error="KeyError('missing')", message=message, attempt=None)


@pytest.mark.parametrize("fmt", ["logfmt", "json", "console"])
def test_log_exception_keeps_the_traceback(configured, fmt):
    out = configured(fmt)
    _fail()
    structlog.get_logger("t").error("monitor_failed", exc_info=ValueError("bad reading"))
    text = out.getvalue()
    assert "Traceback (most recent call last):" in text, text
    assert "KeyError: 'missing'" in text and "_fail" in text, text
    assert "ValueError: bad reading" in text, text  # exc_info=<exception> too
    assert "exc_info" not in text and "attempt" not in text, text


def test_logfmt_line_shape(configured, monkeypatch):
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    out = configured("logfmt")
    structlog.get_logger("t").info("job_started", attempt=0, pid=12, checkpoint=None, ok=True, note='say "hi"',
                                   message="attempt 0 started")
    _fail()
    first, second = out.getvalue().splitlines()  # a traceback does not break the one-line format
    assert first.startswith("event=job_started level=info ts=")
    assert first.endswith(' message="attempt 0 started"')
    assert " attempt=0 pid=12 ok=true note=\"say \\\"hi\\\"\" " in first
    assert "checkpoint=" not in first  # None is left out
    assert second.startswith("event=runner_tick_failed level=error ts=")
    assert second.endswith('KeyError: \'missing\'"') and "\\n" in second
    assert re.search(r" ts=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z ", first)


def test_logfmt_renderer_is_structlogs(configured):
    # the hand-written renderers are gone: the line is what structlog's LogfmtRenderer makes
    line = logsetup.logfmt_line({"event": "x", "a": "b c", "n": None, "message": "m"})
    assert line == structlog.processors.LogfmtRenderer(key_order=["event"])({}, "", {"event": "x", "a": "b c",
                                                                                     "message": "m"})


def test_one_timestamp_key_everywhere(configured, monkeypatch):
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    out = configured("json")
    structlog.get_logger("t").info("hello", attempt=None)
    rec = json.loads(out.getvalue())
    assert logsetup.TIMESTAMP_KEY == "ts" and "ts" in rec and "timestamp" not in rec and "attempt" not in rec
    out = configured("console")
    structlog.get_logger("t").warning("hello")  # (an info event no sentence narrates is not said on a terminal)
    assert re.match(r"\[\d\d:\d\d:\d\d\] ", out.getvalue()) and "timestamp" not in out.getvalue()
    out = configured("logfmt")
    structlog.get_logger("t").info("hello")
    assert " ts=" in out.getvalue() and "timestamp" not in out.getvalue()
    # under the journal the line has no timestamp at all (journald stamps it)
    monkeypatch.setenv("JOURNAL_STREAM", "1:2")
    out = configured("logfmt")
    structlog.get_logger("t").info("hello")
    assert out.getvalue() == "event=hello level=info\n"


def test_secrets_are_masked_in_every_format(configured):
    for fmt in ("logfmt", "json", "console"):
        out = configured(fmt)
        structlog.get_logger("t").warning("env", hf_token="hf_abc123")
        assert "hf_abc123" not in out.getvalue() and "redacted" in out.getvalue(), fmt


def test_a_terminal_at_the_default_level_says_the_narration_and_warnings_only(configured):
    out = configured("console")
    log = structlog.get_logger("t")
    log.info("state_changed", old="running", new="stopping", why="nan")
    log.info("gate_passed", summary="gate passed")
    log.info("job_started", attempt=1)
    log.info("daemon_started", message="supervising run r1")
    log.warning("gpu_blind", message="GPU health is unavailable")
    said = out.getvalue()
    assert "state running" not in said and "gate_passed" not in said
    assert ">> attempt 1 launched" in said and "daemon_started" in said and "gpu_blind" in said
    out = io.StringIO()
    logsetup.configure("console", "debug", out)
    structlog.get_logger("t").info("state_changed", old="running", new="stopping", why="nan")
    assert "state running -> stopping" in out.getvalue()
