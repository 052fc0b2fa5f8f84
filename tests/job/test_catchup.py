"""The job's output is never throttled by the daemon (issue 25 build 7): with the daemon's line
handling held still, the job prints its whole burst and exits; the handling then catches up from
job.log, in order, every line, and the lag it had is reported. Real processes, pipes and files."""
from __future__ import annotations

import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

from structlog.testing import capture_logs

from supervisor.job.catchup import LagGauge, LogReadback
from supervisor.job.keeper import BACKLOG, EOF_STDERR, EOF_STDOUT, GAP_HEAD, GAP_RANGE, STDERR, STDOUT, Keeper
from supervisor.job.osapi import OsApi
from supervisor.job.output import KeeperLink, SinkFanout
from supervisor.job.process import JobProcess, LaunchSpec
from tests.util import wait_for

# nanoGPT's format, a stderr line every 1000; 120k lines (6.7 MB): more than the pipe (1 MiB), the
# socket and the keeper's queue (BACKLOG, 4 MiB) hold, so most of it is read back from job.log.
BURST = ("import sys\n"
         "w = sys.stdout.write\n"
         "for i in range(int(sys.argv[1])):\n"
         "    w(f'iter {i}: loss {2.0 + (i % 97) * 0.001:.4f}, time 12.34ms, mfu 1.20%\\n')\n"
         "    if i % 1000 == 0:\n"
         "        sys.stdout.flush(); sys.stderr.write(f'eval {i}\\n'); sys.stderr.flush()\n")
N = 120_000


class HeldSink:
    """A line sink that holds the output thread still until released (a parser far behind)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.got: dict[str, list[str]] = {"stdout": [], "stderr": []}

    def feed(self, source: str, lines: Sequence[str]) -> None:
        self.entered.set()
        self.release.wait(120)
        self.got[source].extend(lines)


def test_a_burst_never_waits_for_the_daemon_and_every_line_is_handled_later_in_order(tmp_path: Path) -> None:
    fan, sink = SinkFanout(), HeldSink()
    fan.add(sink)
    log = tmp_path / "job.log"
    spec = LaunchSpec((sys.executable, "-c", BURST, str(N)), str(tmp_path), dict(os.environ), {})
    job = JobProcess(spec, fan, None, log, lambda _s: None, OsApi())
    try:
        wait_for(sink.entered.is_set, 30, what="the first lines reaching the held sink")
        # The daemon's handling stands still; the job is not held by it: it prints all and exits.
        wait_for(lambda: job.poll() is not None, 60, what="the job finishing while nothing is handled")
        assert os.waitstatus_to_exitcode(job.status or 0) == 0
        wait_for(lambda: log.read_bytes().count(b"\n") == N + N // 1000, 30, what="every line in job.log")
        lag = job.output_lag()
        assert lag.seconds > 0 and lag.bytes > 0 and lag.draining, lag
        assert not job.pumps_done(0)
        sink.release.set()
        assert job.pumps_done(60), "the handling did not catch up"
        out = sink.got["stdout"]
        assert len(out) == N and out[0].startswith("iter 0:") and out[-1].startswith(f"iter {N - 1}:")
        assert all(line.startswith(f"iter {i}:") for i, line in enumerate(out)), "stdout out of order"
        assert sink.got["stderr"] == [f"eval {i}" for i in range(0, N, 1000)]
        after = job.output_lag()
        assert after.seconds == 0 and after.bytes == 0 and not after.draining
        assert after.max_seconds >= lag.seconds and after.unparsed_bytes == 0
        assert job.link.gauge.read_back > 1 << 20, "the burst should have been read back from job.log"
    finally:
        sink.release.set()
        if job.poll() is None:
            job.signal_group(9)
        job.close()


def test_output_that_can_no_longer_be_read_back_is_counted_and_said(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_bytes(b"a line\n" * 10)
    st = log.stat()
    gauge = LagGauge(str(log))
    back = LogReadback(str(log), gauge)
    payload = GAP_HEAD.pack(st.st_dev, st.st_ino) + GAP_RANGE.pack(STDOUT, 0, 70, 1.0)
    os.truncate(log, 21)  # copytruncate before the parsers caught up: 49 bytes are gone
    with capture_logs() as logs:
        got = b"".join(chunk for _kind, chunk in back.ranges(payload))
    back.close()
    assert got == b"a line\n" * 3
    assert gauge.unparsed == 49 and gauge.lag().unparsed_bytes == 49
    said = [e for e in logs if e["event"] == "output_unparsed"]
    assert said and said[0]["bytes"] == 49 and "not parsed" in said[0]["message"]
    # A file that is not the one the keeper wrote (rotated, recreated) is never read.
    (tmp_path / "new").write_bytes(b"other\n" * 20)
    os.replace(tmp_path / "new", log)  # the new file made while the old exists: another inode
    with capture_logs():
        assert list(LogReadback(str(log), gauge).ranges(payload)) == []
    assert gauge.unparsed == 49 + 70


def _keeper(tmp_path: Path) -> tuple[Keeper, socket.socket, Path]:
    log = tmp_path / "job.log"
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    log_fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    # The pipe fds are only the streams' names here: the test hands chunks to data() itself.
    return Keeper(1000, 1001, theirs.detach(), log_fd, str(log)), ours, log


def test_the_keeper_queues_a_bounded_amount_then_sends_places_and_the_link_gets_every_byte_in_order(
        tmp_path: Path) -> None:
    k, ours, log = _keeper(tmp_path)
    line = b"x" * 1023 + b"\n"
    for _ in range(8192):  # 8 MiB that nobody reads: the keeper never waits
        k.data(STDOUT, line, time.monotonic())
    assert k.queued <= BACKLOG and len(k.gap) == 4, "one range for one stream running on in job.log"
    k.data(STDERR, b"an error\n", time.monotonic())
    k.data(STDOUT, b"after\n", time.monotonic())
    assert len(k.gap) == 12  # each stream change starts a range
    assert log.stat().st_size == 8192 * 1024 + 15  # job.log has all of it already
    fan, sink = SinkFanout(), HeldSink()
    sink.release.set()
    fan.add(sink)
    ended: list[str] = []
    link = KeeperLink(ours.detach(), None, fan, ended.append, log_path=str(log))
    link.start()
    k._frame(EOF_STDOUT, b"")
    k._frame(EOF_STDERR, b"")
    k.flush_blocking()
    os.close(k.sock_fd)
    link.join(30)
    assert not link.is_alive() and sorted(ended) == ["stderr", "stdout"]
    assert sink.got["stdout"] == ["x" * 1023] * 8192 + ["after"] and sink.got["stderr"] == ["an error"]
    assert link.gauge.read_back > 1 << 20 and link.gauge.unparsed == 0
    os.close(k.log.fd)


def test_with_the_daemon_gone_the_keeper_drops_its_queue_and_gap_and_goes_on_with_job_log(tmp_path: Path) -> None:
    k, ours, log = _keeper(tmp_path)
    for _ in range(6000):
        k.data(STDOUT, b"y" * 1023 + b"\n", time.monotonic())
    assert k.gap
    ours.close()  # the daemon is killed
    k.flush()
    assert k.sock_fd == -1 and not k.queue and not k.gap
    k.data(STDOUT, b"later\n", time.monotonic())
    assert log.read_bytes().endswith(b"y\nlater\n") and log.stat().st_size == 6000 * 1024 + 6
    os.close(k.log.fd)
