"""Native journal protocol, checked against a real datagram socket standing in for journald."""
from __future__ import annotations

import io
import os
import socket
import struct
from pathlib import Path

import pytest
import structlog

from supervisor.events import Cause
from supervisor.ops.journal import (JournalProcessor, JournalSender, encode, entry_fields, field_name,
                                    stderr_is_journal)


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
    assert f["TSUP_OK"] == "false" and f["TSUP_PIDS"] == "[1, 2]"
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
        assert entry["MESSAGE"].startswith("event=restart ") and "cause=nan" in entry["MESSAGE"]
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


def test_processor_uses_given_renderer_for_message(journald):
    path, sock = journald
    def render(_l, _n, ed):
        return "RENDERED " + ed.pop("event")
    p = JournalProcessor(render, JournalSender(path))
    ed = {"event": "launch", "attempt": 0}
    with pytest.raises(structlog.DropEvent):
        p(None, "info", ed)
    assert ed == {"event": "launch", "attempt": 0}  # the renderer saw a copy
    assert decode(sock.recv(65536))["MESSAGE"] == "RENDERED launch"


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
