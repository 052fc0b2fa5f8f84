"""Native journal protocol, checked against a real datagram socket standing in for journald."""
from __future__ import annotations

import io
import os
import socket
import struct
import sys
from pathlib import Path

import pytest
import structlog

from supervisor.events import Cause
from supervisor.logsite import log_helper, logged_from
from supervisor import logsetup
from supervisor.ops.journal import (ID_NAMESPACE, JournalProcessor, JournalSender, encode, entry_fields, field_name,
                                    message_id, sentence, stderr_is_journal)


def decode(data: bytes) -> dict[str, str]:
    """journald's parser for the native protocol (both field forms)."""
    out: dict[str, str] = {}
    i = 0
    while i < len(data):
        nl = data.index(b"\n", i)
        line = data[i:nl]
        if b"=" in line:
            k, v = line.split(b"=", 1)
            out[k.decode()] = v.decode()
            i = nl + 1
        else:
            (n,) = struct.unpack("<Q", data[nl + 1:nl + 9])
            out[line.decode()] = data[nl + 9:nl + 9 + n].decode()
            assert data[nl + 9 + n:nl + 10 + n] == b"\n"
            i = nl + 10 + n
    return out


@pytest.fixture
def journald(tmp_path: Path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = tmp_path / "journal.socket"
    sock.bind(str(path))
    sock.settimeout(2.0)
    yield str(path), sock
    sock.close()


def test_field_names():
    assert field_name("run_id") == "TSUP_RUN_ID"
    assert field_name("gpu.mem-used") == "TSUP_GPU_MEM_USED"
    assert len(field_name("x" * 100)) == 64


def test_encode_binary_safe_for_newlines():
    data = encode({"MESSAGE": "line one\nline two", "PRIORITY": "3"})
    assert data.startswith(b"MESSAGE\n" + struct.pack("<Q", 17) + b"line one\nline two\n")
    assert decode(data) == {"MESSAGE": "line one\nline two", "PRIORITY": "3"}


def test_entry_fields_priority_and_values():
    f = entry_fields({"event": "restart", "cause": Cause.NAN, "attempt": 3, "level": "error",
                      "ok": False, "pids": [1, 2], "nothing": None}, "event=restart cause=nan")
    assert f["PRIORITY"] == "3"
    assert f["TSUP_EVENT"] == "restart" and f["TSUP_CAUSE"] == "nan" and f["TSUP_ATTEMPT"] == "3"
    assert f["TSUP_OK"] == "false" and f["TSUP_PIDS"] == "[1,2]"  # spelled as logfmt and the console do
    assert "TSUP_NOTHING" not in f
    assert f["SYSLOG_IDENTIFIER"] == "transformer-supervisor" and f["TSUP_SOURCE"] == "daemon"
    assert entry_fields({"event": "x", "level": "warning"}, "m")["PRIORITY"] == "4"
    assert entry_fields({"event": "x"}, "m", "critical")["PRIORITY"] == "2"


def test_processor_sends_once_and_drops_stderr_line(journald):
    path, sock = journald
    out = io.StringIO()
    structlog.configure(processors=[structlog.processors.add_log_level,
                                    JournalProcessor(sender=JournalSender(path)),
                                    structlog.processors.KeyValueRenderer(key_order=["event"])],
                        logger_factory=structlog.PrintLoggerFactory(out), cache_logger_on_first_use=False)
    try:
        structlog.get_logger("t").error("restart", cause="nan", attempt=3, run_id="r1",
                                        evidence="loss=nan\nat step 5")
        entry = decode(sock.recv(65536))
        assert entry["TSUP_EVENT"] == "restart" and entry["TSUP_CAUSE"] == "nan"
        assert entry["TSUP_ATTEMPT"] == "3" and entry["TSUP_RUN_ID"] == "r1"
        assert entry["TSUP_EVIDENCE"] == "loss=nan\nat step 5"
        assert entry["PRIORITY"] == "3"
        # no message of its own: the event said in words, the data after it (and in the fields)
        assert entry["MESSAGE"].startswith("restart: cause=nan attempt=3")
        assert entry["MESSAGE_ID"] == message_id("restart")
        assert entry["CODE_FILE"] == __file__ and entry["CODE_FUNC"] == "test_processor_sends_once_and_drops_stderr_line"
        assert int(entry["CODE_LINE"]) > 0
        assert out.getvalue() == ""  # not doubled on stderr
    finally:
        structlog.reset_defaults()


def test_processor_falls_back_to_stderr_when_send_fails(tmp_path: Path):
    out = io.StringIO()
    structlog.configure(processors=[JournalProcessor(sender=JournalSender(str(tmp_path / "nope"))),
                                    structlog.processors.KeyValueRenderer(key_order=["event"])],
                        logger_factory=structlog.PrintLoggerFactory(out), cache_logger_on_first_use=False)
    try:
        structlog.get_logger("t").info("gave_up", cause="crash")
        assert out.getvalue().strip() == "event='gave_up' cause='crash'"
    finally:
        structlog.reset_defaults()


def test_processor_uses_given_message_function(journald):
    path, sock = journald
    p = JournalProcessor(lambda ed: "SAID " + ed.pop("event"), JournalSender(path))
    ed = {"event": "launch", "attempt": 0}
    with pytest.raises(structlog.DropEvent):
        p(None, "info", ed)
    assert ed == {"event": "launch", "attempt": 0}  # the message function saw a copy
    assert decode(sock.recv(65536))["MESSAGE"] == "SAID launch"


def test_message_is_a_sentence_and_the_data_stays_in_fields(journald):
    path, sock = journald
    send = JournalProcessor(sender=JournalSender(path))
    with pytest.raises(structlog.DropEvent):
        send(None, "warning", {"event": "restart_scheduled", "level": "warning", "attempt": 0, "cause": "crash",
                               "delay_s": 0.5, "run_id": "r1", "ts": "2026-01-01T00:00:00Z",
                               "message": "attempt 0 failed: crash (exit 1) after 2.2 s; restart 1/10 in 0.5 s",
                               "next": "relaunching from step_100.pt"})
    e = decode(sock.recv(65536))
    assert e["MESSAGE"] == ("attempt 0 failed: crash (exit 1) after 2.2 s; restart 1/10 in 0.5 s; "
                            "next: relaunching from step_100.pt")
    assert e["TSUP_CAUSE"] == "crash" and e["TSUP_DELAY_S"] == "0.5" and e["TSUP_RUN_ID"] == "r1"
    assert e["TSUP_NEXT"] == "relaunching from step_100.pt" and e["TSUP_MESSAGE"].startswith("attempt 0 failed")
    assert "TSUP_TS" not in e  # journald stamps entries itself
    # a summary stands in for a missing message
    assert sentence({"event": "gate_passed", "summary": "pre-launch gate passed", "next": "launching the job"}) \
        == "pre-launch gate passed; next: launching the job"
    assert sentence({"event": "gpu_blind"}) == "gpu blind"


def test_message_ids_are_stable_per_event_kind():
    import uuid

    assert message_id("restart_scheduled") == uuid.uuid5(ID_NAMESPACE, "restart_scheduled").hex
    assert message_id("restart_scheduled") == message_id("restart_scheduled") != message_id("gave_up")
    assert len(message_id("gave_up")) == 32 and message_id("gave_up") == message_id("gave_up").lower()
    # The IDs the docs list are the ones the code sends (journalctl MESSAGE_ID=... must find them).
    doc = (Path(__file__).resolve().parents[2] / "docs" / "operating.md").read_text()
    import re

    listed = re.findall(r"^\| `([a-z_]+)` \| `([0-9a-f]{32})` \|", doc, re.M)
    assert len(listed) >= 8, "docs/operating.md lists the MESSAGE_IDs of the main events"
    for event, mid in listed:
        assert message_id(event) == mid, event


def test_traceback_reaches_the_journal(journald):
    """log.exception() keeps its traceback: after the sentence in MESSAGE and in TSUP_EXCEPTION,
    also when the console format (which formats tracebacks itself) is chosen under the journal."""
    path, sock = journald
    for fmt in ("logfmt", "json", "console"):
        logsetup._extra.clear()
        logsetup.add_processor(JournalProcessor(sender=JournalSender(path)))
        try:
            logsetup.configure(fmt, "info", io.StringIO())
            try:
                {}["missing"]
            except KeyError:
                structlog.get_logger("t").exception("runner_tick_failed", error="KeyError('missing')",
                                                    message="the main loop raised", attempt=None)
        finally:
            logsetup._extra.clear()
            structlog.reset_defaults()
        e = decode(sock.recv(65536))
        assert e["MESSAGE"].startswith("the main loop raised\nTraceback (most recent call last):"), (fmt, e["MESSAGE"])
        assert "KeyError: 'missing'" in e["MESSAGE"] and "KeyError: 'missing'" in e["TSUP_EXCEPTION"], fmt
        assert 'File "' + __file__ in e["TSUP_EXCEPTION"], fmt
        assert e["PRIORITY"] == "3" and "TSUP_ATTEMPT" not in e and "TSUP_EXC_INFO" not in e, fmt
        assert e["CODE_FUNC"] == "test_traceback_reaches_the_journal", fmt


def test_for_environment_only_when_stderr_is_the_journal(journald, tmp_path: Path):
    path, _ = journald
    st = os.fstat(2)
    env = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
    assert stderr_is_journal(env)
    assert isinstance(JournalProcessor.for_environment(env=env, socket_path=path), JournalProcessor)
    assert JournalProcessor.for_environment(env=env, socket_path=path, enabled=False) is None
    assert JournalProcessor.for_environment(env=env, socket_path=str(tmp_path / "none")) is None
    assert JournalProcessor.for_environment(env={"JOURNAL_STREAM": "1:2"}, socket_path=path) is None
    assert JournalProcessor.for_environment(env={}, socket_path=path) is None


def test_long_values_are_capped_to_fit_a_datagram(journald):
    path, sock = journald
    assert JournalSender(path).send(entry_fields({"event": "x", "tb": "y" * 500_000}, "m"))
    entry = decode(sock.recv(1 << 20))
    assert entry["TSUP_TB"].startswith("[...]") and len(entry["TSUP_TB"]) < 9000


def test_the_marker_is_never_overwritten_by_an_events_own_source():
    """``journalctl TSUP_SOURCE=daemon`` finds the detections: their ``source`` key is kept aside."""
    f = entry_fields({"event": "anomaly_detected", "cause": "nan", "source": "output"}, "m")
    assert f["TSUP_SOURCE"] == "daemon" and f["TSUP_EVENT_SOURCE"] == "output"


@log_helper
def _helper_that_logs(event: str) -> None:
    structlog.get_logger("t").warning(event, cause="nan")


def test_code_fields_name_the_call_site_not_a_helper(journald):
    """CODE_* is the line that decided the event: a marked helper's caller; for a state machine
    Record, where it was made (logged_from), though it is logged elsewhere later."""
    from supervisor.core.messages import Record

    path, sock = journald
    structlog.configure(processors=[structlog.processors.add_log_level, JournalProcessor(sender=JournalSender(path))],
                        logger_factory=structlog.PrintLoggerFactory(io.StringIO()), cache_logger_on_first_use=False)
    try:
        here = sys._getframe().f_lineno + 1
        _helper_that_logs("via_helper")
        e = decode(sock.recv(65536))
        assert (e["CODE_FILE"], e["CODE_LINE"], e["CODE_FUNC"]) == (__file__, str(here), _this())
        made_at = sys._getframe().f_lineno + 1
        rec = Record("gave_up", "critical", "gave up")
        assert rec.origin == (__file__, made_at, _this())
        with logged_from(rec.origin):
            _helper_that_logs(rec.event)
        e = decode(sock.recv(65536))
        assert (e["CODE_FILE"], e["CODE_LINE"]) == (__file__, str(made_at))
    finally:
        structlog.reset_defaults()


def _this() -> str:
    return sys._getframe(1).f_code.co_name
