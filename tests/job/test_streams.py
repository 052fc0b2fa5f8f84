"""The job's stdout and stderr kept apart (real processes, the real keeper, real pipes): each to its
own console, job.log with both, job.stderr.log with stderr alone; and an event line of ours never
lands inside a job's line on the console they share."""
from __future__ import annotations

import os
import stat
import sys
import threading
from pathlib import Path

from structlog.testing import capture_logs

from supervisor.job.consoleline import EventStream, SharedLine
from supervisor.job.keeper import stderr_log_path
from supervisor.job.osapi import OsApi
from supervisor.job.console import Consoles, ConsoleWriter
from supervisor.job.output import SinkFanout
from supervisor.job.process import JobProcess, LaunchSpec
from tests.util import wait_for

BOTH = ("import sys\n"
        "for i in range(300):\n"
        "    sys.stdout.write(f'out {i}\\n'); sys.stdout.flush()\n"  # one write a line: job.log
        "    sys.stderr.write(f'err {i}\\n'); sys.stderr.flush()\n"  # interleaves whole lines
        "sys.stderr.write('no newline at the end')\n")


class Sink:
    def __init__(self) -> None:
        self.data = bytearray()

    def reader(self, fd: int) -> threading.Thread:
        def run() -> None:
            while chunk := os.read(fd, 1 << 16):
                self.data += chunk
        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t


def run_job(tmp_path: Path, code: str, consoles: Consoles | None) -> JobProcess:
    spec = LaunchSpec((sys.executable, "-c", code), str(tmp_path), dict(os.environ), {})
    done = threading.Event()
    ended: list[str] = []

    def on_eof(source: str) -> None:
        ended.append(source)
        if len(ended) == 2:
            done.set()

    job = JobProcess(spec, SinkFanout(), consoles, tmp_path / "job.log", on_eof, OsApi())
    wait_for(lambda: job.poll() is not None, 60, what="the job's exit")
    wait_for(done.is_set, 30, what="both streams' end")
    job.close()
    return job


def test_each_stream_to_its_own_console_job_log_has_both_the_sidecar_stderr_alone(tmp_path: Path) -> None:
    (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
    out, err = Sink(), Sink()
    readers = [out.reader(out_r), err.reader(err_r)]
    out_con = ConsoleWriter(os.fdopen(out_w, "wb", buffering=0))
    err_con = ConsoleWriter(os.fdopen(err_w, "wb", buffering=0))
    run_job(tmp_path, BOTH, Consoles(out_con, err_con))
    for con in (out_con, err_con):
        con.close(timeout=10)
        con.stream.close()
    for t in readers:
        t.join(10)
    expected_out = b"".join(b"out %d\n" % i for i in range(300))
    expected_err = b"".join(b"err %d\n" % i for i in range(300)) + b"no newline at the end"
    assert bytes(out.data) == expected_out
    assert bytes(err.data) == expected_err
    log = (tmp_path / "job.log").read_bytes()
    # Both streams, whole lines as written; the unterminated tail may be followed by a stdout
    # chunk the keeper read after it, so it is taken out before comparing lines.
    assert len(log) == len(expected_out) + len(expected_err) and log.count(b"no newline at the end") == 1
    assert (sorted(log.replace(b"no newline at the end", b"").splitlines())
            == sorted(expected_out.splitlines() + expected_err.splitlines()[:-1]))
    sidecar = tmp_path / "job.stderr.log"
    assert sidecar.read_bytes() == expected_err  # byte-exact, nothing of stdout
    assert stat.S_IMODE(sidecar.stat().st_mode) == 0o600


def test_a_symlink_planted_at_the_sidecar_is_not_followed_and_the_job_runs(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"")
    (tmp_path / "job.stderr.log").symlink_to(target)
    with capture_logs() as logs:
        run_job(tmp_path, BOTH, None)
    assert target.read_bytes() == b""  # nothing written through the link
    assert (tmp_path / "job.log").read_bytes().count(b"err ") == 300
    assert [e for e in logs if e["event"] == "job_stderr_log_unavailable"], logs


def test_the_sidecar_is_named_beside_the_log() -> None:
    assert stderr_log_path("/s/job.log") == "/s/job.stderr.log"
    assert stderr_log_path("/srv/logs/supervised.log") == "/srv/logs/supervised.stderr.log"
    assert stderr_log_path("/srv/a.d/out") == "/srv/a.d/out.stderr"
    assert stderr_log_path("/srv/.hidden") == "/srv/.hidden.stderr"


# Prints the start of a line on stderr, waits for a file, then ends the line.
HALF_LINE = ("import os, sys, time\n"
             "sys.stderr.write('epoch 3: 45%'); sys.stderr.flush()\n"
             "while not os.path.exists(sys.argv[1]): time.sleep(0.01)\n"
             "sys.stderr.write(' done\\n'); sys.stderr.flush()\n")


def test_an_event_line_never_lands_inside_a_job_line(tmp_path: Path) -> None:
    r, w = os.pipe()  # one console (a terminal) for the job's stderr and our event lines
    console = Sink()
    reader = console.reader(r)
    line = SharedLine()
    job_side = ConsoleWriter(os.fdopen(w, "wb", buffering=0), line=line)
    events = EventStream(os.fdopen(os.dup(w), "w"), line)
    go = tmp_path / "go"
    spec = LaunchSpec((sys.executable, "-c", HALF_LINE, str(go)), str(tmp_path), dict(os.environ), {})
    job = JobProcess(spec, SinkFanout(), Consoles(None, job_side), tmp_path / "job.log", lambda _s: None, OsApi())
    wait_for(lambda: b"45%" in console.data, 30, what="the job's half line on the console")
    assert line.open
    events.write("event=hang_suspected level=warning\n")  # what structlog's WriteLogger writes
    go.write_text("")
    wait_for(lambda: job.poll() is not None, 30, what="the job's exit")
    assert job.pumps_done(10)
    job.close()
    events.write("event=daemon_exiting\n")  # the job's line was ended: no newline added
    job_side.close(timeout=10)
    job_side.stream.close()
    events.stream.close()
    reader.join(10)
    assert bytes(console.data) == (b"epoch 3: 45%\nevent=hang_suspected level=warning\n done\n"
                                   b"event=daemon_exiting\n")
    assert line.breaks == 1
    assert (tmp_path / "job.log").read_bytes() == b"epoch 3: 45% done\n"  # the job's bytes untouched


def test_a_job_newline_split_from_its_line_is_not_doubled_after_an_event() -> None:
    """A pipe read can split "step 1 loss 1.9" from its newline; an event between them ends the
    line itself, so the job's newline that follows must not leave an empty line (CI saw one)."""
    line = SharedLine()
    with line.job_write(b"step 1 loss 1.9") as shown:
        assert shown == b"step 1 loss 1.9"
    assert line.event_text("!! anomaly\n") == "\n!! anomaly\n"
    with line.job_write(b"\nstep 2 loss 1.8\n") as shown:
        assert shown == b"step 2 loss 1.8\n"  # the newline the event already wrote
    with line.job_write(b"\n") as shown:
        assert shown == b"\n"  # the job's own empty line stays
    assert line.event_text("!! next\n") == "!! next\n" and line.breaks == 1
