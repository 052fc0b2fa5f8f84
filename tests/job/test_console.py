"""The job's pass-through to our stdout never blocks the job or the daemon (real pipes)."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from supervisor.job.output import ConsoleWriter, PipePump, SinkFanout
from tests.util import wait_for


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
    log_path = tmp_path / "job.log"
    logfile = open(log_path, "ab")
    job = subprocess.Popen([sys.executable, "-c", "import sys\nfor i in range(200000): print('line', i)"],
                           stdout=subprocess.PIPE)
    assert job.stdout is not None
    done = threading.Event()
    pump = PipePump(os.dup(job.stdout.fileno()), "stdout", con, logfile, threading.Lock(), SinkFanout(),
                    lambda _s: done.set())
    job.stdout.close()
    pump.start()
    assert job.wait(timeout=60) == 0  # it finished although nobody read the console
    wait_for(done.is_set, 30)
    logfile.close()
    data = log_path.read_bytes()
    assert data.count(b"\n") == 200000 and data.endswith(b"line 199999\n")
    assert con.dropped_bytes > 0
    con.close(timeout=0.1)  # returns although the console still is not read
    os.close(r)


class Exploding:
    def feed(self, source: str, lines: object) -> None:
        raise RuntimeError("a sink bug")


def test_the_pump_survives_any_exception_and_keeps_draining(tmp_path: Path) -> None:
    class BadLog:
        def write(self, b: bytes) -> int:
            raise TypeError("not an OSError")

        def flush(self) -> None:
            raise TypeError("not an OSError")

    job = subprocess.Popen([sys.executable, "-c", "import sys\nfor i in range(100000): print('line', i)"],
                           stdout=subprocess.PIPE)
    assert job.stdout is not None
    done = threading.Event()
    fan = SinkFanout()
    fan.add(Exploding())  # type: ignore[arg-type]
    pump = PipePump(os.dup(job.stdout.fileno()), "stdout", None, BadLog(), threading.Lock(), fan,  # type: ignore[arg-type]
                    lambda _s: done.set())
    job.stdout.close()
    pump.start()
    assert job.wait(timeout=60) == 0
    wait_for(done.is_set, 30)
    assert pump.bytes > 1_000_000


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
