"""The end of a run through the real daemon (issue 34, round 3): a NaN in the job's last moment is
judged, never "finished successfully": a last line without a newline in a text log or on stdout,
a NaN written to metrics.jsonl while the job writes without pause and exits at once; and
``wrap ... | tee train.log`` in the job's workdir does not read the daemon's own console back as
the job's log. Unit tests: tests/watch/test_metricfile_exit.py."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, history

slow = pytest.mark.slow

# First attempt: the fault; later ones: clean (a marker beside the workdir).
TEXT_LOG_JOB = r'''
import os, sys, time
work = sys.argv[1]
faulty = not os.path.exists(os.path.join(work, "..", "marker"))
open(os.path.join(work, "..", "marker"), "a").close()
with open(os.path.join(work, "train.log"), "a") as f:
    for s in range(1, 25):
        f.write(f"step {s} loss {1.0 / s:.4f}\n"); f.flush(); time.sleep(0.02)
    f.write("step 25 loss nan" if faulty else "step 25 loss 0.04\n")  # no newline, then exit 0
'''

BURST_JOB = r'''
import json, os, sys, time
work = sys.argv[1]
faulty = not os.path.exists(os.path.join(work, "..", "marker"))
open(os.path.join(work, "..", "marker"), "a").close()
f = open(os.path.join(work, "metrics.jsonl"), "a")
t, s = time.monotonic(), 0
while time.monotonic() - t < 1.0:  # without pause: the reader is always busy when it exits
    s += 1
    f.write(json.dumps({"step": s, "loss": 1.0 / s}) + "\n"); f.flush()
    time.sleep(0.002)
if faulty:
    f.write(json.dumps({"step": s + 1, "loss": float("nan")}) + "\n"); f.flush()
os._exit(0)  # at once: no interpreter teardown between the NaN and the exit
'''

PRINT_JOB = r'''
import time
for s in range(1, 31):
    print(f"step {s} loss {2.0 / s:.4f}", flush=True)
    time.sleep(0.03)
'''


def wrap_cmd(tmp: Path, work: Path) -> list[str]:
    cfg = tmp / "tsup.toml"
    cfg.write_text(f'[validation]\nsteps = 1\n[job]\nworkdir = "{work}"\n')
    return [sys.executable, "-m", "supervisor", "--log-format", "logfmt", "wrap", "--config", str(cfg),
            "--state-dir", str(tmp / "sd"), "--backoff", "0", "--"]


def run(tmp: Path, job: list[str]) -> tuple[int, str, list[dict[str, Any]]]:
    """One supervised run to its end: exit code, the daemon's stderr, its attempts."""
    work = tmp / "work"
    work.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([*wrap_cmd(tmp, work), *job], cwd=str(ROOT), capture_output=True, timeout=120)
    err = proc.stderr.decode(errors="replace")
    return proc.returncode, err, history(tmp / "sd")["attempts"]


def assert_nan_rolled_back(code: int, err: str, attempts: list[dict[str, Any]], source: str) -> None:
    assert code == 0 and len(attempts) == 2, (code, attempts, err[-3000:])
    assert attempts[0]["cause"] == "nan" and attempts[1]["exit_code"] == 0, attempts
    [failure] = [line for line in err.splitlines() if line.startswith("event=failure_detected ")]
    assert f"source={source}" in failure, failure


@slow
def test_a_text_logs_last_line_without_a_newline_is_judged(tmp_path: Path) -> None:
    job = tmp_path / "job.py"
    job.write_text(TEXT_LOG_JOB)
    code, err, attempts = run(tmp_path, [sys.executable, str(job), str(tmp_path / "work")])
    assert_nan_rolled_back(code, err, attempts, f"log:{tmp_path / 'work' / 'train.log'}")


@slow
def test_the_last_output_line_without_a_newline_is_judged(tmp_path: Path) -> None:
    script = ('if [ -e ../marker ]; then printf "step 25 loss 0.1\\n"; '
              'else touch ../marker; printf "step 24 loss 0.5\\nstep 25 loss nan"; fi')
    (tmp_path / "work").mkdir()
    code, err, attempts = run(tmp_path, ["sh", "-c", script])
    assert_nan_rolled_back(code, err, attempts, "stdout")


@slow
def test_a_nan_written_to_a_metric_file_in_the_job_s_last_moment_is_judged_every_time(tmp_path: Path) -> None:
    # Before: about 1 run in 20 ended "finished" over the NaN (detected ~25 ms after the end).
    job = tmp_path / "job.py"
    job.write_text(BURST_JOB)
    for i in range(5):
        tmp = tmp_path / f"run{i}"
        code, err, attempts = run(tmp, [sys.executable, str(job), str(tmp / "work")])
        assert_nan_rolled_back(code, err, attempts, f"file:{tmp / 'work' / 'metrics.jsonl'}")


@slow
def test_wrap_piped_to_tee_into_the_workdir_does_not_read_its_own_console_back(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    job = tmp_path / "job.py"
    job.write_text(PRINT_JOB)
    cmd = " ".join(map(str, [*wrap_cmd(tmp_path, work), sys.executable, job]))
    # The pipeline as a user types it; the daemon's stderr (its narration) goes through tee too.
    proc = subprocess.run(f"cd {ROOT} && {cmd} 2>&1 | tee {work / 'train.log'} > {tmp_path / 'console'}",
                          shell=True, timeout=120)
    assert proc.returncode == 0
    console = (tmp_path / "console").read_text()
    assert "step 30 loss" in console and "event=daemon_exiting" in console  # tee got it all
    followed = [line for line in console.splitlines() if line.startswith("event=metric_file_followed ")]
    assert followed == [], followed
    [attempt] = history(tmp_path / "sd")["attempts"]
    assert attempt["exit_code"] == 0 and attempt["cause"] is None, attempt
    [end] = [line for line in console.splitlines() if line.startswith("event=daemon_exiting ")]
    sources = re.search(r"watched: ([^;\"]*)", end)
    assert sources is not None and "train.log" not in sources.group(1) and "stdout" in sources.group(1), end
    assert json.dumps(history(tmp_path / "sd")).count("train.log") == 0
