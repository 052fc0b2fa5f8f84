"""Generated job output through the real watcher and the real sinks (issue 34 part 8: the
hypothesis suite grows from parsers to every input surface). Lines as a job prints them (prose,
the secrets of tests/secretcorpus.py in prose, control bytes, ANSI escapes, Unicode line
separators, long lines, invalid UTF-8 decoded as the line splitter decodes it) go to the real
:class:`LogWatcher`; what it logs, and the daemon's events that carry the job's text (a detection's
evidence, a sample line), go through the real structlog chain (``logsetup.configure``: console
narration, logfmt, JSON) and the real :class:`EventRecorder` into a real ledger:

- no secret of the corpus reaches a sink (any renderer's output, a ledger row);
- no line is forged: the job's text never makes a line break, a raw escape sequence or another
  control character in a rendered log line (each sink's lines are its own ``\\n``-ended lines:
  logfmt lines begin ``event=``, JSON lines parse, the console's lines begin with its stamp or
  its indentation, never with text the job put after a break);
- prose that speaks of NaN without a NaN value ("0 NaN detected", "skipping nan check") is
  never a ``nan`` detection.
"""
from __future__ import annotations

import io
import json
import re
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import structlog
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from supervisor import logsetup
from supervisor.daemon.plugin import ConcernSet
from supervisor.daemon.recorder import EventRecorder
from supervisor.events import Cause
from supervisor.ledger.store import Ledger
from supervisor.watch.config import DetectorsConfig
from supervisor.watch.logwatch import LogWatcher

from .helpers.fuzzseed import fuzz
from .secretcorpus import SECRET_LINES, leaks

SUITE = fuzz(40, HealthCheck.too_slow, HealthCheck.data_too_large)  # seeded from the run

MARK = "FORGED"
# What could start a line of its own, or drive a terminal, in a log line: each put before MARK.
BREAKS = ["\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\x1b[2K\r", "\x1b[1A",
          "\x1bE", "\x9bA", "\x1b]0;title\x07", "\x1b[31m", "\x08" * 8, "\x00", "\x7f", "\t"]
WORDS = ["the", "model", "NaN", "nan", "NAN", "inf", "Inf", "-inf", "0", "12", "detected", "check", "skipping",
         "found", "no", "values", "in", "is", "False", "True", "?", "scaler", "reduced", "overflow", "warning:",
         "weights", "were", "of", "with", "were", "a", "(", ")", ",", ".", "[rank0]:", "ok", "Epoch", "done"]
PROSE = st.lists(st.sampled_from(WORDS), min_size=1, max_size=20).map(" ".join)
SECRET = st.sampled_from([line for line, _ in SECRET_LINES])
SAFE = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7e), max_size=30)


def decoded(data: bytes) -> str:
    """Bytes as the line splitter makes a line of them (job/linesplit.py): UTF-8, errors replaced."""
    return data.decode("utf-8", "replace").replace("\n", " ")


LINES = st.one_of(
    PROSE,
    st.tuples(SAFE, SECRET, SAFE).map(lambda t: f"{t[0]} {t[1]} {t[2]}"),  # a secret amid prose
    st.tuples(PROSE, st.sampled_from(BREAKS), PROSE).map(lambda t: f"{t[0]} a{t[1]}{MARK} {t[2]}"),
    st.tuples(SECRET, st.sampled_from(BREAKS)).map(lambda t: f"x{t[1]}{MARK} {t[0]}"),
    st.binary(max_size=80).map(decoded),
    st.tuples(st.integers(1, 100_000), SECRET).map(lambda t: "x" * t[0] + " " + t[1]),  # long, its secret at the end
    st.text(max_size=60).map(lambda s: s.replace("\n", " ")),
)

# C0 controls but "\n", DEL, C1 controls (8-bit CSI, NEL), Unicode line and paragraph separators.
_RAW = re.compile(r"[\x00-\x09\x0b-\x1f\x7f\x80-\x9f\u2028\u2029]")


def sink_output(fmt: str, lines: list[str], ledger: Ledger) -> tuple[str, list[Any]]:
    """The lines through a LogWatcher under the real structlog chain for ``fmt``, then the
    daemon's events for what it found and a sample line: (what the renderer wrote, detections)."""
    out = io.StringIO()
    logsetup.configure(fmt, level="debug", stream=out)
    detections: list[Any] = []
    lw = LogWatcher(DetectorsConfig(), detections.append, lambda r: None, clock=lambda: 0.0)
    lw.feed("stdout", lines)
    recorder = EventRecorder(ledger, ConcernSet([]), lambda: ("run-1", 1))
    for d in detections:
        recorder.event("failure_detected", "warning", f"detected {d.cause.value}: {d.summary}", cause=d.cause.value,
                       summary=d.summary, evidence=d.evidence, source=d.source, step=d.step)
    for line in lines[:2]:  # the blind hint's samples: job text in the message and in a list value
        recorder.event("metrics_blind", "warning", f"no metrics in the output; it printed: {line[:200]}",
                       samples=[line[:200]])
    return out.getvalue(), detections


def check_lines(fmt: str, text: str) -> None:
    assert not leaks(text), (fmt, leaks(text))
    raw = _RAW.search(text)
    assert raw is None, (fmt, repr(raw.group()), text[max(0, raw.start() - 80):raw.end() + 80])
    assert len(text.splitlines()) == text.count("\n"), fmt  # no line break but the sink's own "\n"
    for line in text.splitlines():
        assert not line.lstrip().startswith(MARK), (fmt, line)
        if fmt == "logfmt":
            assert line.startswith("event="), line
        elif fmt == "json":
            assert isinstance(json.loads(line), dict), line
        else:
            assert re.match(r"\[\d\d:\d\d:\d\d\] |\s{11}", line), line


@SUITE
@given(st.lists(LINES, min_size=1, max_size=6))
def test_job_output_reaches_no_sink_with_a_secret_or_a_forged_line(lines: list[str]) -> None:
    saved = structlog.get_config()
    try:
        with tempfile.TemporaryDirectory(prefix="fuzzout") as sd:
            ledger = Ledger(Path(sd))
            try:
                ledger.open_run("fuzz", {})
                for fmt in ("console", "logfmt", "json"):
                    text, _ = sink_output(fmt, lines, ledger)
                    check_lines(fmt, text)
            finally:
                ledger.close()
            with sqlite3.connect(Path(sd) / ledger.path.name) as db:
                rows = db.execute("SELECT event, message, data_json FROM events").fetchall()
        stored = "\n".join(f"{e} {m} {d}" for e, m, d in rows)
        assert not leaks(stored), leaks(stored)
    finally:
        structlog.configure(**saved)


PROSE_LINES = st.one_of(PROSE, st.tuples(PROSE, st.sampled_from(BREAKS), PROSE).map(lambda t: f"{t[0]}{t[1]}{t[2]}"),
                        st.tuples(st.sampled_from(["", "\x1b[32m", "[rank1]: ", "INFO: "]), PROSE).map("".join))


@SUITE
@given(st.lists(PROSE_LINES, min_size=1, max_size=10))
def test_prose_that_speaks_of_nan_is_never_a_nan_detection(lines: list[str]) -> None:
    detections: list[Any] = []
    lw = LogWatcher(DetectorsConfig(), detections.append, lambda r: None, clock=lambda: 0.0)
    lw.feed("stdout", lines)
    assert [d for d in detections if d.cause is Cause.NAN] == [], (lines, detections)


def test_the_first_forged_lines_found_are_escaped_in_logfmt_and_on_the_console() -> None:
    """What the suite found first: logfmt kept a job's "\\r" raw (a terminal showing the log
    redrew the line from the job's text on), and the console kept C1 controls raw (U+0085 is a
    new line to a terminal, U+009B an escape's start) and the Unicode line separators."""
    line = "step a\rFORGED b\x85FORGED c\x9b2J d\u2028FORGED e\tlevel=error"
    for fmt in ("logfmt", "console"):
        saved = structlog.get_config()
        out = io.StringIO()
        try:
            logsetup.configure(fmt, level="debug", stream=out)
            structlog.get_logger("t").warning("metrics_blind", message=f"it printed: {line}", samples=[line])
        finally:
            structlog.configure(**saved)
        check_lines(fmt, out.getvalue())
        assert out.getvalue().count("\n") == 1 and "FORGED" in out.getvalue()
    assert logsetup.logfmt_line({"event": "x", "v": "a\rb\tc"}) == "event=x v=a\\rb\\tc"
