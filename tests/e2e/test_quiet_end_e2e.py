"""A quiet job through the real daemon (issue 35 parts 1, 2): it prints two lines, then trains in
silence keeping its loss only in a private binary file, its weights turn NaN, and it saves them
and exits 0. The supervisor calls it blind within ``blind_after_s`` (naming the file it writes,
never the daemon's own console.log or job.log), and its end is said for what it was: "finished,
unwatched", with non-finite weights in its checkpoint, in the console, status, history, the
journal's events, the textfile and the notification; exit 3 (a human must look), not 0."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import datetime

import pytest

from tests.conftest import ROOT, history

PY = sys.executable
JOB = ROOT / "tests" / "trainer_scripts" / "quiet_binary_train.py"
BLIND_AFTER_S = 3
HOOK = "import sys\nwith open(sys.argv[1], 'a') as f:\n    f.write(sys.stdin.read().replace('\\n', ' ') + '\\n')\n"


def _at(event: dict) -> float:
    return datetime.fromisoformat(event["at"]).timestamp()


@pytest.mark.slow
def test_a_quiet_job_over_nan_weights_is_called_blind_early_and_its_end_unwatched_with_nan_weights(tmp_path):
    work, ckpt = tmp_path / "work", tmp_path / "ckpt"
    work.mkdir()
    sd = work / "sd"  # inside the working dir: its job.log is recent text the walk meets, and must skip
    prom, notified, hook = tmp_path / "m.prom", tmp_path / "notified.jsonl", tmp_path / "hook.py"
    hook.write_text(HOOK)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[detectors]\nblind_after_s = {BLIND_AFTER_S}\n[metrics]\ntextfile = {json.dumps(str(prom))}\n"
                   f"[notify]\ncommand = {json.dumps([PY, str(hook), str(notified)])}\n")
    console = work / "console.log"  # the daemon's own output, redirected into the job's working dir
    with open(console, "wb") as out:
        proc = subprocess.Popen([PY, "-m", "supervisor", "--log-format", "console", "wrap", "--config", str(cfg),
                                 "--state-dir", str(sd), "--workdir", str(work), "--checkpoint-dir", str(ckpt),
                                 "--max-restarts", "0", "--", PY, str(JOB), "--out_dir", "out", "--ckpt_dir",
                                 str(ckpt), "--steps", "60", "--step_s", "0.1", "--nan_at", "10"],
                                cwd=str(ROOT), stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            rc = proc.wait(120)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
    said = console.read_text(errors="replace")
    assert rc == 3, said[-3000:]
    h = history(sd)
    events = {e["event"]: e for e in h["events"]}

    # Blind within blind_after_s (+10 s of slack) of the start, while the job still ran, naming its file.
    blind = [e for e in h["events"] if e["event"] == "metrics_blind"]
    assert len(blind) == 1, said[-3000:]
    started = _at(events["job_started"])
    assert _at(blind[0]) - started <= BLIND_AFTER_S + 10
    assert _at(blind[0]) < datetime.fromisoformat(h["attempts"][0]["ended_at"]).timestamp()
    assert blind[0]["data"]["written"][:1] == ["out/losses.dat"], blind[0]
    assert "out/losses.dat (a format no parser here reads)" in blind[0]["message"]
    for own in ("console.log", "job.log", "job.stderr.log"):
        assert own not in blind[0]["message"], blind[0]["message"]

    # The end: unwatched, NaN weights in the newest checkpoint; a give-up, not "finished successfully".
    step = ckpt / "step_60.pt"
    assert h["state"] == "gave_up" and h["exit_code"] == 3
    assert h["reason"].startswith(f"finished with non-finite weights in {step}: 6 tensor(s) hold NaN/Inf")
    assert "finished, unwatched" in h["reason"] and "successfully" not in said
    nan = events["checkpoint_nonfinite_at_end"]
    assert nan["level"] == "error" and nan["data"]["verdict"] == "nonfinite_weights"
    assert nan["data"]["weights"]["finite"] is False and "0.weight" in nan["data"]["weights"]["nonfinite"]
    assert events["run_unwatched"]["data"]["sources"] == [] and "gave_up" in events
    # The console (the journal's lines), status without a daemon, the textfile, the notification.
    assert "XX finished with non-finite weights in" in said and "XX gave up: finished with non-finite" in said
    assert "!! finished, unwatched: the job exited 0 after" in said
    st = subprocess.run([PY, "-m", "supervisor", "status", "--state-dir", str(sd)], cwd=ROOT, capture_output=True,
                        text=True, timeout=60)
    assert st.returncode == 3 and "non-finite weights" in st.stdout and "finished, unwatched" in st.stdout, st
    text = prom.read_text()
    assert ',verdict="nonfinite_weights"} 1.0' in text and ',state="gave_up"} 1.0' in text  # after name="..."
    sent = [json.loads(line)["event"] for line in notified.read_text().splitlines()]
    assert "run_unwatched" in sent and "gave_up" in sent
