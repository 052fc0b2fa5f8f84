"""The job's pass-through to our stdout never blocks the job or the daemon (real pipes)."""
from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from supervisor.job.osapi import OsApi
from supervisor.job.console import Console, Consoles, ConsoleWriter
from supervisor.job.output import SinkFanout
from supervisor.job.process import JobProcess, LaunchSpec
from tests.util import wait_for


def spawn(tmp_path: Path, code: str, console: Console | None, fanout: SinkFanout,
          on_eof: Callable[[str], None] = lambda _s: None) -> JobProcess:
    """A real job through the real output keeper, its job.log in ``tmp_path``; both of its
    streams to ``console``."""
    spec = LaunchSpec((sys.executable, "-c", code), str(tmp_path), dict(os.environ), {})
    return JobProcess(spec, fanout, Consoles(console, console) if console is not None else None,
                      tmp_path / "job.log", on_eof, OsApi())


def wait_exit(job: JobProcess, timeout: float = 60) -> int:
    wait_for(lambda: job.poll() is not None, timeout, what="the job's exit")
    assert job.status is not None
    return os.waitstatus_to_exitcode(job.status)


def test_a_console_that_stops_reading_drops_and_counts_then_says_so(tmp_path: Path) -> None:
    r, w = os.pipe()
    stream = os.fdopen(w, "wb", buffering=0)
    con = ConsoleWriter(stream, limit=1 << 20, stall_s=0.3)
    chunk = b"x" * 65536 + b"\n"
    started = time.monotonic()
    for _ in range(200):  # 13 MB into a pipe nobody reads (it holds 64 KiB)
        con.offer(chunk)
    assert time.monotonic() - started < 2.0  # offer waited once, stall_s, then dropped
    assert con.dropped_bytes > 10 << 20 and con.pending() <= 1 << 20
    received = bytearray()
    reader = threading.Thread(target=read_into, args=(r, received), daemon=True)
    reader.start()  # the console reads again
    con.offer(b"after the stall\n")
    wait_for(lambda: b"after the stall" in received, 10)
    text = bytes(received)
    assert b"were not shown here because this console stopped reading" in text
    assert str(con.dropped_bytes).encode() in text
    con.close()
    stream.close()


def read_into(fd: int, out: bytearray) -> None:
    while True:
        b = os.read(fd, 1 << 16)
        if not b:
            return
        out += b


def test_a_blocked_console_does_not_block_the_job_and_the_log_keeps_everything(tmp_path: Path) -> None:
    r, w = os.pipe()  # our stdout, never read during the job
    con = ConsoleWriter(os.fdopen(w, "wb", buffering=0), limit=256 << 10, stall_s=0.5)
    done = threading.Event()
    job = spawn(tmp_path, "import sys\nfor i in range(200000): print('line', i)", con, SinkFanout(),
                lambda _s: done.set())
    assert wait_exit(job) == 0  # it finished although nobody read the console
    wait_for(done.is_set, 30)
    job.close()
    data = (tmp_path / "job.log").read_bytes()
    assert data.count(b"\n") == 200000 and data.endswith(b"line 199999\n")
    assert con.dropped_bytes > 0
    con.close(timeout=0.1)  # returns although the console still is not read
    os.close(r)


class Exploding:
    def feed(self, source: str, lines: object) -> None:
        raise RuntimeError("a sink bug")


def test_the_output_link_survives_any_exception_and_keeps_draining(tmp_path: Path) -> None:
    class BadConsole:
        def offer(self, chunk: bytes) -> None:
            raise TypeError("not an OSError")

    fan = SinkFanout()
    fan.add(Exploding())
    job = spawn(tmp_path, "import sys\nfor i in range(100000): print('line', i)", BadConsole(), fan)
    assert wait_exit(job) == 0
    assert job.pumps_done(30)
    assert job.link.bytes > 1_000_000
    job.close()
    assert (tmp_path / "job.log").read_bytes().count(b"\n") == 100000


def test_a_slow_but_reading_console_gets_every_byte(tmp_path: Path) -> None:
    r, w = os.pipe()
    con = ConsoleWriter(os.fdopen(w, "wb", buffering=0), limit=64 << 10, stall_s=5.0)
    received = bytearray()

    def slow_reader() -> None:
        while True:
            b = os.read(r, 4096)
            if not b:
                return
            received.extend(b)
            time.sleep(0.0005)  # a slow terminal: it reads, just not fast

    t = threading.Thread(target=slow_reader, daemon=True)
    t.start()
    payload = b"".join(b"line %d\n" % i for i in range(100000))
    for i in range(0, len(payload), 8192):
        con.offer(payload[i:i + 8192])
    con.close(timeout=30)
    wait_for(lambda: len(received) >= len(payload), 30)
    assert bytes(received) == payload and con.dropped_bytes == 0
