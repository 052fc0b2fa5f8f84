"""[job] prewarm through the real daemon: a torch job that crashes once relaunches in the standby
(its imports done, its output, metrics and resume as in a cold start), and a doubt makes the
attempt cold with its reason in history."""
from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest

from tests.conftest import history

PY = sys.executable

# Attempt 0 saves a checkpoint at step 3 and crashes, but only once the standby for attempt 1
# (found by its runner and this job's cwd; attempt 0 runs in the runner too, so not itself) has torch loaded: the relaunch then always meets a
# standby with its imports done. Each attempt says whether torch was imported before its own
# first line ran (the proof that it ran in the standby), and where it resumed from.
JOB = """
import os, sys, json, time
pre = "torch" in sys.modules
import torch
out, attempt = sys.argv[1], os.environ["TSUP_ATTEMPT"]
json.dump({"pre": pre, "argv": sys.argv, "name": __name__, "cwd": os.getcwd(), "pid": os.getpid(),
           "resume": os.environ.get("TSUP_RESUME_FROM"), "cuda": torch.cuda.is_initialized()},
          open(os.path.join(out, f"attempt-{attempt}.json"), "w"))

def standby_has_torch():
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if (int(pid) != os.getpid() and b"standby.py" in open(f"/proc/{pid}/cmdline", "rb").read()
                    and os.readlink(f"/proc/{pid}/cwd") == os.getcwd()
                    and "libtorch" in open(f"/proc/{pid}/maps").read()):
                return True
        except OSError:
            continue
    return False

start = int(os.environ.get("TSUP_RESUME_STEP") or 0)
for step in range(start + 1, start + 6):
    print(f"step {step}: loss {1.0 / step:.4f}", flush=True)
    if step == 3 and attempt == "0":
        torch.save({"step": 3, "w": torch.ones(2)}, os.path.join(out, "ck", "step_3.pt"))
        deadline = time.monotonic() + 120
        while not standby_has_torch() and time.monotonic() < deadline:
            time.sleep(0.05)
        raise RuntimeError("crash once")
"""


WAITS_FOR_STANDBY = """
import os, sys, time

def wait_for_standby():
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if (int(pid) != os.getpid() and b"standby.py" in open(f"/proc/{pid}/cmdline", "rb").read()
                        and os.readlink(f"/proc/{pid}/cwd") == os.getcwd()):
                    return
            except OSError:
                continue
        time.sleep(0.02)
"""


def _wrap(sd: Path, work: Path, *flags: str) -> list[str]:
    # No prewarm key: on by default (issue 38), so each of these tests runs the default.
    return ["wrap", "--state-dir", str(sd), "--backoff", "0", "--set", f"job.workdir={work}", *flags, "--"]


@pytest.mark.slow  # two torch imports (the cold attempt's, the standby's)
def test_a_crash_relaunches_in_the_standby_with_output_metrics_and_resume_intact(daemons, tmp_path):
    sd, out = tmp_path / "sd", tmp_path / "out"
    (out / "ck").mkdir(parents=True)
    (out / "job.py").write_text(JOB)
    d = daemons(_wrap(sd, out, "--checkpoint-dir", str(out / "ck")) + [PY, "job.py", str(out)])
    assert d.wait(180) == 0, d.stderr()[-3000:]
    a0, a1 = (json.loads((out / f"attempt-{n}.json").read_text()) for n in (0, 1))
    assert not a0["pre"] and a1["pre"]  # attempt 1 found torch imported: it ran in the standby
    for a in (a0, a1):  # what a cold start would see
        assert a["argv"] == ["job.py", str(out)] and a["name"] == "__main__" and a["cwd"] == str(out)
        assert a["cuda"] is False  # imported, not initialised
    assert a1["resume"] == str(out / "ck" / "step_3.pt")
    h = history(sd)
    rows = h["attempts"]
    assert [r["prewarm"] for r in rows][1] == "used", rows
    assert rows[0]["prewarm"].startswith("cold: no standby was ready")
    assert rows[1]["argv"] == [PY, "job.py", str(out)]  # the exact command, as configured
    assert rows[1]["exit_code"] == 0 and rows[0]["cause"] == "crash"
    log = (sd / "job.log").read_text()
    assert "crash once" in log and "step 8: loss" in log  # both attempts' output in the job log
    db = sqlite3.connect(sd / "ledger.sqlite")
    steps = [r[0] for r in db.execute("SELECT step FROM metrics WHERE attempt=1 ORDER BY step")]
    assert steps == [4, 5, 6, 7, 8]  # its metrics parsed as any attempt's
    mods = (sd / "prewarm" / "attempt-1.modules").read_text().split()
    assert "torch" in mods and "job" not in mods  # recorded for the next standby


def test_a_doubt_makes_the_attempt_cold_with_the_reason_in_history(daemons, tmp_path):
    sd, out = tmp_path / "sd", tmp_path / "out"
    out.mkdir()
    # Each failing attempt waits for the next one's standby: a relaunch never finds none ready.
    (out / "job.py").write_text(WAITS_FOR_STANDBY + "print('step 1: loss 1.0', flush=True)\n"
                                "if os.environ['TSUP_ATTEMPT'] in ('0', '1'):\n"
                                "    wait_for_standby()\n"
                                "    sys.exit(1)\n")
    cfg = tmp_path / "c.toml"
    # The remedy changes an environment variable the imports could have read: no standby serves it.
    cfg.write_text('[on.crash]\nremedies = [{ env = { CUDA_VISIBLE_DEVICES = "1" } }]\n')
    d = daemons(_wrap(sd, out, "--config", str(cfg)) + [PY, "job.py"])
    assert d.wait(60) == 0, d.stderr()[-3000:]
    rows = history(sd)["attempts"]
    assert [bool(r["remedies"]) for r in rows] == [False, False, True], rows  # the crash repeated: a remedy
    assert rows[1]["prewarm"] == "used"
    assert rows[2]["prewarm"] == "cold: environment variable CUDA_VISIBLE_DEVICES changed", rows[2]
    # Not a plain Python job at all: cold, and said so.
    sd2 = tmp_path / "sd2"
    d = daemons(_wrap(sd2, out) + ["/bin/sh", "-c", "exit 0"])
    assert d.wait(60) == 0, d.stderr()[-3000:]
    [row] = history(sd2)["attempts"]
    assert row["prewarm"] == "cold: not a plain Python job (sh is not a Python interpreter)"


# An installed package of the job's own venv: it says its version and which process imported it.
PACKAGE = """
import os
VERSION = {version}
open(os.path.join({out!r}, f"imported-v{version}-{{os.getpid()}}"), "w").close()
"""
# Attempt 0 idles once the standby for attempt 1 (another process) has imported the package;
# each attempt records the version it runs.
USES_PACKAGE = """
import json, os, signal, sys, time
import tsupdemo
out, attempt = sys.argv[1], os.environ["TSUP_ATTEMPT"]
json.dump({"version": tsupdemo.VERSION, "pid": os.getpid()}, open(os.path.join(out, f"attempt-{attempt}.json"), "w"))
print("step 1: loss 1.0", flush=True)
if attempt == "0":
    mine = f"imported-v1-{os.getpid()}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not [f for f in os.listdir(out) if f.startswith("imported-v1-") and f != mine]:
        time.sleep(0.02)
    open(os.path.join(out, "ready"), "w").close()
    signal.pause()  # until the operator's restart stops it
"""


def test_a_package_upgraded_before_a_restart_starts_the_attempt_cold_with_the_new_code(daemons, tmp_path):
    """Issue 34 part 6: the standby imported version 1 of an installed package; the operator
    upgrades it (the file replaced) and restarts: the attempt starts cold and runs version 2, and
    history says why."""
    import os
    import subprocess

    from tests.util import wait_for
    from tests.watch.test_watch_e2e import _cli

    sd, out, venv = tmp_path / "sd", tmp_path / "out", tmp_path / "venv"
    out.mkdir()
    subprocess.run([PY, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    vpy = str(venv / "bin" / "python")
    site = Path(subprocess.run([vpy, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True, timeout=60).stdout.strip())
    (site / "tsupdemo.py").write_text(PACKAGE.format(version=1, out=str(out)))
    (out / "job.py").write_text(USES_PACKAGE)
    d = daemons(_wrap(sd, out) + [vpy, "job.py", str(out)])
    wait_for(lambda: (out / "ready").exists() or d.proc.poll() is not None, 90, what="the standby to import v1")
    standby_v1 = [f for f in os.listdir(out) if f.startswith("imported-v1-")
                  and f != f"imported-v1-{json.loads((out / 'attempt-0.json').read_text())['pid']}"]
    assert standby_v1, (sorted(os.listdir(out)), d.stderr()[-3000:])
    new = site / "tsupdemo.py.new"
    # A size of its own, as a release has: a same-size file written in the same second as v1 is
    # taken from v1's cached bytecode by Python itself (the pyc records the source's mtime in
    # seconds and its size), by a cold start as much as by anything we do.
    new.write_text(PACKAGE.format(version=2, out=str(out)) + "# 2.0: the hot-fix\n")
    new.replace(site / "tsupdemo.py")  # as pip installs a file: a new inode in its place
    cp = _cli("restart", "--reason", "hot-fix of tsupdemo", "--state-dir", str(sd))
    assert cp.returncode == 0, cp.stderr
    assert d.wait(60) == 0, d.stderr()[-3000:]
    assert json.loads((out / "attempt-1.json").read_text())["version"] == 2
    rows = history(sd)["attempts"]
    assert [r["cause"] for r in rows] == ["manual", None], rows
    assert rows[1]["prewarm"] == "cold: code changed (tsupdemo)", rows[1]
