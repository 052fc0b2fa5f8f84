"""`wrap` keeps the job's stdout and stderr apart, and `logs` reads them back (real daemon, real
jobs, real files): -n, --stderr, -f following a running job until the daemon exits."""
from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
from pathlib import Path

from supervisor.cli.logs import follow, last_lines_offset
from tests.conftest import ROOT
from tests.util import wait_for

PY = sys.executable

BOTH = ("import sys\n"
        "for i in range(5):\n"
        "    sys.stdout.write(f'out {i}\\n'); sys.stdout.flush()\n"
        "    sys.stderr.write(f'err {i}\\n'); sys.stderr.flush()\n")

# Prints "line i" every 20 ms until the file named by argv[1] exists, then "last" and exits 0.
PRINTER = ("import os, sys, time\n"
           "i = 0\n"
           "while not os.path.exists(sys.argv[1]):\n"
           "    print('line', i, flush=True); i += 1; time.sleep(0.02)\n"
           "print('last', flush=True)\n")


def logs(sd: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "supervisor", "logs", "--state-dir", str(sd), *flags], cwd=str(ROOT),
                          capture_output=True, text=True, timeout=60)


def test_wrap_keeps_the_streams_apart_and_logs_reads_them_back(daemons, tmp_path: Path) -> None:
    sd = tmp_path / "sd"
    d = daemons(["wrap", "--state-dir", str(sd), "--", PY, "-c", BOTH])
    assert d.wait() == 0
    assert d.stdout().splitlines() == [f"out {i}" for i in range(5)]  # the job's stdout only
    err = d.stderr().splitlines()
    assert [l for l in err if l.startswith("err ")] == [f"err {i}" for i in range(5)]
    assert any(l.startswith("event=job_started") for l in err)  # our events beside them
    assert not [l for l in err if l.startswith("out ")]
    log = (sd / "job.log").read_text().splitlines()
    assert sorted(log) == sorted([f"out {i}" for i in range(5)] + [f"err {i}" for i in range(5)])

    r = logs(sd, "-n", "2")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == log[-2:]
    r = logs(sd, "--stderr")
    assert r.returncode == 0 and r.stdout == "".join(f"err {i}\n" for i in range(5)), r.stderr
    r = logs(sd, "-n", "0")
    assert r.returncode == 0 and r.stdout.splitlines() == log
    r = logs(sd, "-f")  # the daemon has exited: the tail, then done
    assert r.returncode == 0 and r.stdout.splitlines() == log


def test_logs_without_a_log_says_so_and_exits_1(tmp_path: Path) -> None:
    r = logs(tmp_path / "nothing")
    assert r.returncode == 1
    assert "no job log at" in r.stderr and str(tmp_path / "nothing" / "job.log") in r.stderr
    r = logs(tmp_path / "nothing", "-n", "-3")
    assert r.returncode == 2 and "0 (all) or more" in r.stderr


def test_logs_reads_the_configured_log_file(daemons, tmp_path: Path) -> None:
    sd, log = tmp_path / "sd", tmp_path / "logs" / "run.log"
    d = daemons(["wrap", "--state-dir", str(sd), "--log-file", str(log), "--", PY, "-c", BOTH])
    assert d.wait() == 0
    r = logs(sd, "-n", "1", "--stderr")  # [job] log_file read from the run's config in the ledger
    assert r.returncode == 0 and r.stdout == "err 4\n", r.stderr
    assert (tmp_path / "logs" / "run.stderr.log").exists() and not (sd / "job.log").exists()


def test_logs_f_follows_a_running_job_and_ends_when_the_daemon_exits(daemons, tmp_path: Path) -> None:
    sd, stop = tmp_path / "sd", tmp_path / "stop"
    d = daemons(["wrap", "--state-dir", str(sd), "--", PY, "-c", PRINTER, str(stop)])
    wait_for(lambda: (sd / "job.log").exists() and b"line 3\n" in (sd / "job.log").read_bytes(), 30,
             what="the job's lines in job.log")
    out_path = tmp_path / "follow.out"
    with open(out_path, "wb") as out:
        f = subprocess.Popen([PY, "-m", "supervisor", "logs", "-f", "-n", "1", "--state-dir", str(sd)],
                             cwd=str(ROOT), stdout=out, stderr=subprocess.PIPE)
    try:
        # Lines written after it started reach it: it follows, not only prints the tail.
        # A whole first line (the follower may have written a part of it when first looked at).
        first = wait_for(lambda: b"\n" in (got := out_path.read_bytes()) and got.split(b"\n", 1)[0], 30,
                         what="the tail")
        n = int(first.split()[1])
        wait_for(lambda: b"line %d\n" % (n + 5) in out_path.read_bytes(), 30, what="followed lines")
        assert f.poll() is None  # the daemon runs: it keeps following
        stop.write_text("")
        assert d.wait() == 0
        assert f.wait(30) == 0  # the daemon exited and the log stopped growing: it ends by itself
    finally:
        if f.poll() is None:
            f.kill()
            f.wait()
    got = out_path.read_bytes()
    assert got.endswith(b"last\n")
    log = (sd / "job.log").read_bytes()
    assert log.endswith(got)  # every byte from the tail on, in order, none twice


def test_the_tail_offset_counts_lines_from_the_end() -> None:
    data = b"".join(b"line %d\n" % i for i in range(20000))  # several 64 KiB blocks
    f = io.BytesIO(data)
    assert data[last_lines_offset(f, len(data), 2):] == b"line 19998\nline 19999\n"
    assert data[last_lines_offset(f, len(data), 12000):].count(b"\n") == 12000
    assert last_lines_offset(f, len(data), 0) == 0 and last_lines_offset(f, len(data), 99999) == 0
    partial = b"a\nb\nhalf"
    assert partial[last_lines_offset(io.BytesIO(partial), len(partial), 2):] == b"b\nhalf"


def test_follow_reads_across_rotation_and_truncation(tmp_path: Path) -> None:
    path = tmp_path / "job.log"
    path.write_bytes(b"one\n")
    out = io.BytesIO()
    running = threading.Event()
    running.set()
    f = open(path, "rb")
    t = threading.Thread(target=follow, args=(path, f, 0, out, running.is_set, 0.01), daemon=True)
    t.start()
    wait_for(lambda: out.getvalue() == b"one\n", 10)
    with open(path, "ab") as w:
        w.write(b"two\n")
    wait_for(lambda: out.getvalue().endswith(b"two\n"), 10)
    path.rename(tmp_path / "job.log.1")  # logrotate, create mode
    with open(tmp_path / "job.log.1", "ab") as w:
        w.write(b"three\n")  # the writer's last bytes into the old file
    path.write_bytes(b"four\n")
    wait_for(lambda: out.getvalue().endswith(b"four\n"), 10, what="the new file after rotation")
    os.truncate(path, 0)  # copytruncate; then less than was there (a same-size rewrite is
    with open(path, "ab") as w:  # undetectable, for tail -F as well)
        w.write(b"5\n")
    wait_for(lambda: out.getvalue().endswith(b"5\n"), 10, what="the file truncated in place")
    running.clear()  # the daemon exits: follow ends once nothing more comes
    t.join(10)
    assert not t.is_alive()
    assert out.getvalue() == b"one\ntwo\nthree\nfour\n5\n"
