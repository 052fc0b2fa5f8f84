"""The job outlives its daemon (issue 12): a ``kill -9`` of the daemon while the job prints
neither kills the job (no EPIPE: its pipes are held by the output keeper, not the daemon) nor
loses a line of job.log (the keeper writes each chunk before anything else), and the next daemon
on the same state dir closes the previous life as before. Real daemons, real signals."""
from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import stat
import sys
from pathlib import Path
from typing import Iterator

import psutil

from tests.conftest import Daemon, history, pid_alive, started_daemons
from tests.util import wait_for

PY = sys.executable

# Attempt 0 prints a line on stdout and one on stderr every 5 ms, forever, and records each line
# after the print returned (so a line in printed-N was accepted by the pipe). Later attempts exit 0.
JOB = r'''
import os, sys, time
out = sys.argv[1]
n = int(os.environ["TSUP_ATTEMPT"])
if n > 0:
    print("attempt", n, "done", flush=True)
    sys.exit(0)
open(os.path.join(out, "pid.tmp"), "w").write(str(os.getpid()))
os.replace(os.path.join(out, "pid.tmp"), os.path.join(out, "pid"))
record = open(os.path.join(out, "printed"), "a")
i = 0
while True:
    print(f"out {i}", flush=True)
    record.write(f"out {i}\n")
    print(f"err {i}", file=sys.stderr, flush=True)
    record.write(f"err {i}\n")
    record.flush()
    i += 1
    time.sleep(0.005)
'''


@contextlib.contextmanager
def daemon_factory(tmp_path: Path, cfg: Path) -> Iterator[object]:
    def make(n: int) -> Daemon:
        own = tmp_path / f"daemon{n}"  # each daemon its own stdout/stderr files
        own.mkdir()
        return Daemon(["run", "--config", str(cfg)], own)

    with started_daemons(make) as start:
        yield start


def printed(out: Path) -> list[str]:
    p = out / "printed"
    return p.read_text().splitlines() if p.exists() else []


def keepers_of(log: Path) -> list[int]:
    """Output keepers still running that write ``log``."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = p.info["cmdline"] or []
        if any(a.endswith("keeper.py") for a in cmd) and str(log) in cmd:
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    found.append(p.info["pid"])
            except psutil.NoSuchProcess:
                continue
    return found


def test_kill_9_of_the_daemon_while_the_job_prints_the_job_survives_and_job_log_keeps_every_line(tmp_path):
    sd, out = tmp_path / "sd", tmp_path / "out"
    out.mkdir()
    job = tmp_path / "job.py"
    job.write_text(JOB)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[job]\nname = "outlive"\ncommand = ["{PY}", "{job}", "{out}"]\n[state]\ndir = "{sd}"\n'
                   '[gpu]\nbackend = "none"\n[policy]\nbackoff_initial_s = 0\n'
                   '[shutdown]\ngrace_s = 2\nleftover_grace_s = 1\n')
    with daemon_factory(tmp_path, cfg) as start:
        d1 = start(0)
        wait_for(lambda: (out / "pid").exists(), 30, what="the job started")
        pid = int((out / "pid").read_text())
        wait_for(lambda: len(printed(out)) >= 100, 30, what="the job printing")
        os.kill(d1.proc.pid, signal.SIGKILL)
        d1.proc.wait(10)
        # No daemon now: the job prints on (stdout and stderr) and is not hurt by it.
        seen = len(printed(out))
        wait_for(lambda: len(printed(out)) >= seen + 400 or not pid_alive(pid), 30, what="the job printing on")
        assert pid_alive(pid), "the job died when its daemon was killed"
        assert len(printed(out)) >= seen + 400
        assert keepers_of(sd / "job.log"), "the output keeper should outlive the daemon"
        # A new daemon on the same state dir closes the previous life (stops the job) and goes on.
        d2 = start(1)
        assert d2.wait(60) == 0, d2.stderr()[-3000:]
        assert not pid_alive(pid)
    h = history(sd)
    a0 = h["attempts"][0]
    assert a0["counted"] is False and "daemon was restarted" in a0["summary"], a0["summary"]
    assert [a["attempt"] for a in h["attempts"]] == [0, 1] and h["attempts"][1]["exit_code"] == 0
    # Every line the job printed, before, during and after the daemon's death, is in job.log.
    wait_for(lambda: not keepers_of(sd / "job.log"), 10, what="the old keeper gone with the last writer")
    log = (sd / "job.log").read_text(errors="replace").splitlines()
    have = set(log)
    lines = printed(out)
    missing = [x for x in lines if x not in have]
    assert not missing, f"{len(missing)} of {len(lines)} printed lines missing from job.log, e.g. {missing[:3]}"
    assert "attempt 1 done" in have
    assert stat.S_IMODE(os.stat(sd / "job.log").st_mode) == 0o600


def test_stdout_and_stderr_stay_apart_for_the_parsers(tmp_path):
    """A progress bar on stderr without a newline never runs into a metric line on stdout: each
    stream is split into lines of its own (job.log, like a terminal, shows them interleaved)."""
    sd = tmp_path / "sd"
    code = ("import sys, json\n"
            "for i in range(1, 6):\n"
            "    sys.stderr.write(f'\\r{i * 20}%|####'); sys.stderr.flush()\n"
            "    sys.stdout.write(json.dumps({'step': i, 'loss': 1.5}) + '\\n'); sys.stdout.flush()\n")
    own = tmp_path / "d"
    own.mkdir()
    with started_daemons(lambda: Daemon(["wrap", "--state-dir", str(sd), "--", PY, "-c", code], own)) as start:
        d = start()
        assert d.wait(60) == 0, d.stderr()[-3000:]
    db = sqlite3.connect(sd / "ledger.sqlite")
    try:
        steps = sorted(s for (s,) in db.execute("SELECT step FROM metrics WHERE loss = 1.5"))
    finally:
        db.close()
    assert steps == [1, 2, 3, 4, 5]
    raw = (sd / "job.log").read_bytes()
    assert raw.count(b'"loss": 1.5') == 5 and raw.count(b"%|####") == 5
