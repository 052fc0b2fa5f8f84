"""Never harm the run over a file the job never wrote (issue 34, X1), through the real daemon with
no metric config: a NaN line in ``notes.txt`` / ``notes.log`` written into the job's workdir by
another process during a healthy run is ``metric_file_untrusted`` (a warning naming the file) and
the run finishes with exit 0 on its first attempt; a NaN the job writes into its own log is still
rolled back, whether the job opens, appends and closes the file per step or holds it open (a NaN
in its first line). The rules: supervisor/watch/writers.py (tests/watch/test_writers.py).
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import history
from tests.e2e.test_metricfiles_e2e import workdir
from tests.e2e.test_trainers_e2e import PY, attempts, events, supervise, wrap  # noqa: F401 (fixture)
from tests.util import wait_for

slow = pytest.mark.slow

HEALTHY = r'''
import os, sys, time
work, release = sys.argv[1], sys.argv[2]
open(os.path.join(work, "..", "started"), "w").close()
t, s = time.monotonic(), 0
while not os.path.exists(release) and time.monotonic() - t < 90:
    s += 1
    print(f"step {s} loss {2.0 / s:.4f}", flush=True)
    time.sleep(0.05)
'''

# First attempt: a NaN at step 15; later ones: clean (a marker beside the workdir). Nothing per
# step on stdout: the file is the only place the NaN is.
APPEND_CLOSE = r'''
import os, sys, time
work = sys.argv[1]
faulty = not os.path.exists(os.path.join(work, "..", "marker"))
open(os.path.join(work, "..", "marker"), "a").close()
for s in range(1, 41):
    with open(os.path.join(work, "log.txt"), "a") as f:
        f.write(f"step {s} loss {'nan' if faulty and s == 15 else f'{1.0 / s:.4f}'}\n")
    time.sleep(0.05)
'''

HELD_OPEN = r'''
import logging, os, sys, time
work = sys.argv[1]
faulty = not os.path.exists(os.path.join(work, "..", "marker"))
open(os.path.join(work, "..", "marker"), "a").close()
os.makedirs(os.path.join(work, "out"), exist_ok=True)
log = logging.getLogger("train")
log.addHandler(logging.FileHandler(os.path.join(work, "out", "train.log")))
log.setLevel(logging.INFO)
if faulty:
    log.info("step 1 loss nan")  # the first line: no history in the file, the writer holds it open
    time.sleep(90)
for s in range(1, 11):
    log.info("step %d loss %.4f", s, 1.0 / s)
    time.sleep(0.05)
'''


def job(tmp: Path, name: str, text: str, *args: str) -> list[str]:
    (tmp / "work").mkdir(exist_ok=True)
    (tmp / f"{name}.py").write_text(text)
    return [PY, str(tmp / f"{name}.py"), str(tmp / "work"), *args]


@slow
def test_a_nan_in_a_file_another_process_writes_into_the_workdir_never_rolls_back(supervise, tmp_path: Path) -> None:
    release, work = tmp_path / "release", tmp_path / "work"
    d = supervise(wrap(tmp_path, config=workdir(work)) + job(tmp_path, "healthy", HEALTHY, str(release)))
    try:
        wait_for(lambda: (tmp_path / "started").exists(), 60, what="the job's start")
        for name in ("notes.txt", "notes.log"):  # not the job's: another process writes them
            subprocess.run([PY, "-c", f"open({str(work / name)!r}, 'w').write('step 4 loss nan\\n')"],
                           check=True, timeout=30)
        said = wait_for(lambda: (lambda e: e if len(e) == 2 else None)(events(d, "metric_file_untrusted")), 60,
                        what="both files said untrusted")
    finally:
        release.touch()
    assert d.wait(120) == 0, d.stderr()[-3000:]
    assert {e["path"] for e in said} == {str(work / "notes.txt"), str(work / "notes.log")}, said
    assert all(e["level"] == "warning" and "watch_files" in e["next"] for e in said), said
    a = attempts(tmp_path / "sd")
    assert len(a) == 1 and a[0]["exit_code"] == 0 and not a[0].get("cause"), a
    assert events(d, "failure_detected") == []
    # The clean end says what it set aside: no "finished" over a NaN it saw and did not act on.
    reason = history(tmp_path / "sd")["reason"]
    assert "NOT acted on: a non-finite value in" in reason and str(work / "notes.txt") in reason, reason


@slow
@pytest.mark.parametrize("name,text,log", [("append_close", APPEND_CLOSE, "log.txt"),
                                           ("held_open", HELD_OPEN, "out/train.log")])
def test_a_nan_the_job_writes_into_its_own_log_is_still_rolled_back(supervise, tmp_path: Path,
                                                                    name: str, text: str, log: str) -> None:
    work = tmp_path / "work"
    d = supervise(wrap(tmp_path, config=workdir(work)) + job(tmp_path, name, text))
    assert d.wait(180) == 0, d.stderr()[-3000:]
    a = attempts(tmp_path / "sd")
    assert a[0]["cause"] == "nan" and len(a) == 2 and a[1]["exit_code"] == 0, a
    [nan] = events(d, "failure_detected")
    assert nan["source"] == f"log:{work / log}", nan
    assert events(d, "metric_file_untrusted") == []


# Issue 34, the adversarial round on the writer rule: every kind of metric file the walk finds,
# written by another process while a healthy job runs (it prints its steps: a trusted step source).
FOREIGN = {
    # D2: appended over time, finite steps 1..3 then a NaN, while the job is far past step 4
    "notes.txt": "import time\nfor l in ['step 1 loss 2.0', 'step 2 loss 1.9', 'step 3 loss 1.8', 'step 4 loss nan']:\n"
                 "    open('notes.txt', 'a').write(l + '\\n'); time.sleep(0.5)\n",
    # D3: an old run's log copied in: its whole history at once, steps far from the job's
    "old/train.log": "import os, shutil, tempfile\nd = tempfile.mkdtemp()\n"
                     "open(os.path.join(d, 'train.log'), 'w').write(''.join(f'step {s} loss 1.0\\n' for s in "
                     "range(100, 103)) + 'step 103 loss nan\\n')\nos.makedirs('old', exist_ok=True)\n"
                     "shutil.copy(os.path.join(d, 'train.log'), 'old/train.log')\n",
    # D4: another tool's JSONL
    "other_tool.jsonl": "open('other_tool.jsonl', 'w').write('{\"step\": 1, \"loss\": NaN}\\n')\n",
    # D5: another process's TensorBoard writer, and an MLflow file store metric
    "runs/exp": "from torch.utils.tensorboard import SummaryWriter\nw = SummaryWriter('runs/exp')\n"
                "for s in range(1, 5):\n    w.add_scalar('loss', float('nan') if s == 4 else 1.0, s)\nw.close()\n",
    "mlruns/0/abc/metrics/loss": "import os\nos.makedirs('mlruns/0/abc/metrics', exist_ok=True)\n"
                                 "open('mlruns/0/abc/metrics/loss', 'w').write('1700000000000 nan 4\\n')\n",
}


@slow
@pytest.mark.parametrize("name", list(FOREIGN))
def test_a_nan_in_any_metric_file_another_process_writes_never_rolls_back(supervise, tmp_path: Path,
                                                                          name: str) -> None:
    release, work = tmp_path / "release", tmp_path / "work"
    fast = HEALTHY.replace("time.sleep(0.05)", "time.sleep(0.01)")  # far past step 4 when the writer starts
    d = supervise(wrap(tmp_path, config=workdir(work)) + job(tmp_path, "healthy", fast, str(release)))
    try:
        wait_for(lambda: (tmp_path / "started").exists(), 60, what="the job's start")
        subprocess.run([PY, "-c", FOREIGN[name]], check=True, timeout=60, cwd=work)
        try:
            said = wait_for(lambda: events(d, "metric_file_untrusted"), 60, what="the file said untrusted")
        except AssertionError:
            print("\n".join(x[:400] for x in d.events() if "metric" in x or "fail" in x or "source" in x))
            raise
    finally:
        release.touch()
    assert d.wait(120) == 0, d.stderr()[-3000:]
    assert all(e["path"].startswith(str(work / name)) and e["level"] == "warning"
               and "watch_files" in e["next"] for e in said), said
    a = attempts(tmp_path / "sd")
    assert len(a) == 1 and a[0]["exit_code"] == 0 and not a[0].get("cause"), a
    assert events(d, "failure_detected") == []
