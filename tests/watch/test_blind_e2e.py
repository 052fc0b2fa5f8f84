"""Saying what it sees, through the real daemon: a job whose format nothing understands gets a
loud ``metrics_blind`` with the fix; the fix (``wrap --metric-regex``) then reads its steps and its
NaN; a blind job that crashes after showing work is a crash that made progress, not one that
failed without progress."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, history
from tests.util import wait_for

PY = sys.executable
BLIND_LINES = 40

# Prose around the numbers: none of the built-in formats (the generic one included) reads it.
JOB = """\
import os, sys, time
nan_at = int(sys.argv[1]); go = sys.argv[2]
print("HF_TOKEN=hf_secretvalue123 set for the hub", flush=True)
for i in range(1, 200):
    loss = float("nan") if i >= nan_at else 2.0 - i / 1000
    print(f">>> worker 0 finished iter {i} of 300 with train_loss {loss:.4f} and lr 0.05", flush=True)
    if i == %d:  # the blind bound is reached here: wait until the test has looked
        while not os.path.exists(go):
            time.sleep(0.02)
    time.sleep(0.01)
""" % (BLIND_LINES - 1)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "supervisor", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


def _events(sd: Path, name: str) -> list[dict]:
    return [e for e in history(sd)["events"] if e["event"] == name]


def test_unknown_format_is_blind_within_the_bound_and_the_guessed_regex_then_reads_steps_and_nan(daemons, tmp_path):
    job = tmp_path / "job.py"
    job.write_text(JOB)
    go = tmp_path / "go"
    sd = tmp_path / "sd"
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[detectors]\nblind_after_lines = {BLIND_LINES}\nblind_after_s = 0\n")
    d = daemons(["wrap", "--config", str(cfg), "--state-dir", str(sd), "--max-restarts", "0", "--grace", "2",
                 "--", PY, str(job), "1000", str(go)])
    # The job holds after its 40th line (the token line + 39): the warning must come now.
    wait_for(lambda: "event=metrics_blind" in d.stderr(), 20, 0.05, "metrics_blind on the console")
    st = json.loads(_cli("status", "--json", "--state-dir", str(sd)).stdout)
    blind = st["metrics_blind"]
    assert blind is not None and blind["lines"] == BLIND_LINES and st["metric_sources"] == []
    assert blind["fix"].startswith("wrap --metric-regex '")
    human = _cli("status", "--state-dir", str(sd)).stdout
    assert "BLIND" in human and "fix: wrap --metric-regex" in human
    go.touch()
    ev = wait_for(lambda: _events(sd, "metrics_blind"), 10, 0.1, "metrics_blind in the ledger")[0]
    assert ev["level"] == "warning" and "--metric-regex '" in ev["message"]
    assert "[detectors.parsers] regexes" in ev["message"] and "generic" in ev["message"]
    assert "hf_secretvalue123" not in ev["message"] and "hf_secretvalue123" not in d.stderr()
    assert ev["message"].count("  | >>> worker 0 finished iter") >= 3
    regex = ev["data"]["regex"]
    assert d.wait(30) == 0  # the job ran to its end, unwatched: what metrics_blind warned about
    assert len(_events(sd, "metrics_blind")) == 1

    # The fix from the message: steps and the NaN are read.
    sd2, go2 = tmp_path / "sd2", tmp_path / "go2"
    d2 = daemons(["wrap", "--config", str(cfg), "--state-dir", str(sd2), "--max-restarts", "0", "--grace", "2",
                  "--metric-regex", regex, "--", PY, str(job), "60", str(go2)])

    def sources() -> list:
        cp = _cli("status", "--json", "--state-dir", str(sd2))
        return json.loads(cp.stdout).get("metric_sources") or [] if cp.returncode == 0 else []

    src = wait_for(lambda: [s for s in sources() if s["last_step"] == BLIND_LINES - 1], 20, 0.1,
                   "status shows the step read through the regex")[0]
    assert src["source"] == "stdout" and src["formats"] == ["regex"] and src["records"] == BLIND_LINES - 1
    go2.touch()
    assert d2.wait(30) == 3
    h = history(sd2)
    a = h["attempts"][0]
    assert a["cause"] == "nan" and a["detection"]["step"] == 60 and a["detection"]["onset_step"] == 60
    assert not [e for e in h["events"] if e["event"] == "metrics_blind"]


CRASHER = """\
import os, sys, time
if os.environ["TSUP_ATTEMPT"] != "0":
    print("attempt", os.environ["TSUP_ATTEMPT"], "has nothing left to do", flush=True)
    sys.exit(0)
seconds = float(sys.argv[1])
t0 = time.monotonic()
while time.monotonic() - t0 < seconds:  # work the supervisor cannot read
    print(f"[worker] chewing batch at {time.monotonic() - t0:.2f}", flush=True)
    time.sleep(0.1)
raise SystemExit("worker crashed")
"""


def _crash_run(daemons, tmp_path: Path, name: str, seconds: float) -> dict:
    job = tmp_path / f"{name}.py"
    job.write_text(CRASHER)
    sd = tmp_path / name
    cfg = tmp_path / f"{name}.toml"
    cfg.write_text("[policy]\nbackoff_initial_s = 1.5\nbackoff_jitter = 0\nblind_progress_after_s = 1\n"
                   "blind_progress_active_s = 3\n")
    d = daemons(["wrap", "--config", str(cfg), "--state-dir", str(sd), "--", PY, str(job), str(seconds)])
    assert d.wait(40) == 0, d.stderr()[-2000:]
    return history(sd)


def test_a_blind_crash_after_showing_work_restarts_as_progress_and_one_at_startup_backs_off(daemons, tmp_path):
    worked = _crash_run(daemons, tmp_path, "worked", 5.0)
    a = worked["attempts"][0]
    assert a["cause"] == "crash" and a["action"] == "restart"
    sched = [e for e in worked["events"] if e["event"] == "restart_scheduled"][0]
    assert sched["data"]["delay_s"] == 0 and "made progress" in sched["data"]["delay_reason"]
    # The same job crashing during its start-up (its output spans less than the start-up time).
    early = _crash_run(daemons, tmp_path, "early", 0.0)  # only its traceback
    sched = [e for e in early["events"] if e["event"] == "restart_scheduled"][0]
    assert early["attempts"][0]["cause"] == "crash"
    assert sched["data"]["delay_s"] == 1.5 and "without progress" in sched["data"]["delay_reason"]
