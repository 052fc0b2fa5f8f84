"""job.log rotation through the real daemon (issue 37 part 10): a job printing far past a small
``[job] log_max_bytes``; every byte it printed is in job.log + job.log.1..N, the NaN it prints
after several rotations is still detected, and ``logs`` shows the newest lines (from job.log.1
too when job.log holds fewer; ``logs -f`` follows across every rotation)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, history
from tests.util import wait_for

PY = sys.executable

# Attempt 0: 20000 steps (2 MB: more than a pipe and a keeper read hold), then a NaN, then waits to
# be stopped. stdout only: job.log is both streams as the keeper read them, and a read of a full
# pipe can end mid-line, so the other stream's bytes may land inside a line (tests/job/ checks
# the stderr log's rotation on its own).
# Attempt 1 (the rollback's relaunch): three steps, then exit 0.
JOB = """\
import os, sys, time
first = os.environ["TSUP_ATTEMPT"] == "0"
if first:  # once `logs -f` follows (the test makes the file named by argv[1])
    print("ready", flush=True)
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.01)
for step in range(1, 20001 if first else 4):
    sys.stdout.write('{"step": %d, "loss": %.4f, "pad": "%s"}\\n' % (step, 3 - step / 10000, "p" * 60))
    sys.stdout.flush()
if first:
    print('{"step": 20001, "loss": NaN, "note": "after the rotations"}', flush=True)
    time.sleep(120)
"""


def logs(sd: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "supervisor", "logs", "--state-dir", str(sd), *flags], cwd=str(ROOT),
                          capture_output=True, text=True, timeout=60)


def test_a_rotated_job_log_keeps_every_byte_its_nan_is_detected_and_logs_shows_the_newest(daemons, tmp_path):
    sd, job, go = tmp_path / "sd", tmp_path / "job.py", tmp_path / "go"
    job.write_text(JOB)
    d = daemons(["wrap", "--state-dir", str(sd), "--backoff", "0", "--set", "job.log_max_bytes=8192",
                 "--set", "job.log_keep=100", "--", PY, str(job), str(go)])
    wait_for(lambda: (sd / "job.log").exists() and b"ready\n" in (sd / "job.log").read_bytes(), 60,
             what="the job's first line")
    followed = tmp_path / "followed"
    with open(followed, "wb") as out:  # logs -f from the first line on, across every rotation
        f = subprocess.Popen([PY, "-m", "supervisor", "logs", "-f", "-n", "0", "--state-dir", str(sd)],
                             cwd=str(ROOT), stdout=out, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: followed.read_bytes() == b"ready\n", 30, what="logs -f printing the first line")
        go.write_text("")
        assert d.wait(120) == 0, d.stderr()[-3000:]
        assert f.wait(60) == 0  # the daemon exited and the log stopped growing: it ends by itself
    finally:
        if f.poll() is None:
            f.kill()
            f.wait()
    a = history(sd)["attempts"]
    assert [(x["cause"], x["action"]) for x in a] == [("nan", "rollback"), (None, None)], a
    assert a[0]["detection"]["step"] == 20001, a[0]["detection"]

    log = sd / "job.log"
    rotated = sorted(sd.glob("job.log.*"), key=lambda p: int(p.suffix[1:]))
    assert len(rotated) >= 5 and [p.name for p in rotated] == [f"job.log.{n}" for n in range(1, len(rotated) + 1)]
    text = b"".join(p.read_bytes() for p in [*reversed(rotated), log]).decode()
    lines = text.splitlines()
    def step(s: int) -> str:
        return '{"step": %d, "loss": %.4f, "pad": "%s"}' % (s, 3 - s / 10000, "p" * 60)

    expected_out = (["ready"] + [step(s) for s in range(1, 20001)] + ['{"step": 20001, "loss": NaN, "note": "after the rotations"}']
                    + [step(s) for s in range(1, 4)])
    assert lines == expected_out  # every byte, once, in order
    assert followed.read_text() == text  # logs -f read on into each new job.log
    said = [ln for ln in d.stderr().splitlines() if ln.startswith("event=job_log_rotated")]
    assert len(said) == len(rotated) and "log_max_bytes 8192" in said[0], said[:1]

    in_current = log.read_bytes().count(b"\n")
    r = logs(sd, "-n", str(in_current + 4))  # more than job.log holds: the rest from job.log.1
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == lines[-(in_current + 4):]
    r = logs(sd, "-n", "0")  # the whole log: every rotated file kept, oldest first
    assert r.returncode == 0 and r.stdout == text
