"""Checkpoint before the NaN, through the real daemon: a job that saves every 100 steps and honours
the checkpoint signal (supervisor.client) diverges at step 260 after a grad-norm ramp. With the
precursor watch on (the default) the daemon asks for a checkpoint during the ramp and the rollback
lands a few steps before the onset; with it off, a whole save interval back (step 200)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, history

PY = sys.executable

JOB = """
import json, os, sys, time
from pathlib import Path
import torch
from supervisor import client
ck = Path(sys.argv[1])
ck.mkdir(exist_ok=True)
start = 0
frm = os.environ.get("TSUP_RESUME_FROM")
if frm:
    start = torch.load(frm, weights_only=True)["step"]
attempt = int(os.environ["TSUP_ATTEMPT"])

def save(step):
    path = ck / f"step_{step:05d}.pt"
    torch.save({"step": step, "w": torch.ones(4)}, path)
    client.record_checkpoint(path, step=step)

for step in range(start + 1, 301):
    ramp = attempt == 0 and 250 <= step < 260
    time.sleep(0.12 if ramp else 0.01)  # the ramp spans ~1.2 s: room for the request to arrive
    grad = 1.0 + 0.01 * (step % 7)
    if ramp:
        grad = 2.0 ** (step - 248)
    loss = 2.0 - step * 1e-3
    if attempt == 0 and step == 260:
        print(json.dumps({"step": step, "loss": float("nan"), "grad_norm": float("nan")}), flush=True)
        time.sleep(30)
    print(json.dumps({"step": step, "loss": loss, "grad_norm": grad}), flush=True)
    if step % 100 == 0 or client.should_checkpoint():
        save(step)
"""


def run(daemons, tmp: Path, enabled: bool) -> dict:
    ck, sd = tmp / "ck", tmp / "sd"
    tmp.mkdir()
    cfg = tmp / "tsup.toml"
    cfg.write_text(f"[detectors.precursor]\nenabled = {'true' if enabled else 'false'}\nwarmup_steps = 50\n"
                   "[checkpoints]\nsettle_s = 0.5\n")
    d = daemons(["wrap", "--state-dir", str(sd), "--backoff", "0", "--config", str(cfg), "--checkpoint-dir", str(ck),
                 "--env", f"PYTHONPATH={ROOT}", "--", PY, "-c", JOB, str(ck)])
    assert d.wait(180) == 0, d.stderr()[-3000:]
    return history(sd)


@pytest.mark.slow
def test_a_grad_norm_ramp_gets_a_checkpoint_before_the_nan_and_the_rollback_lands_near_the_onset(daemons, tmp_path):
    h = run(daemons, tmp_path / "on", enabled=True)
    atts = h["attempts"]
    assert [a["cause"] for a in atts] == ["nan", None], [a["cause"] for a in atts]
    pre = [e for e in h["events"] if e["event"] == "divergence_precursor"]
    assert len(pre) == 1 and pre[0]["data"]["kind"] == "grad_norm_ramp", pre
    assert any(e["event"] == "checkpoint_requested" for e in h["events"])
    # Saves every 100 steps: without the request the rollback goes to 200 (a whole interval back);
    # with it, at most a quarter of the interval before the onset (260).
    assert atts[1]["resume_step"] is not None and atts[1]["resume_step"] >= 260 - 25, atts[1]["resume_step"]


@pytest.mark.slow
def test_without_the_precursor_watch_the_rollback_goes_a_whole_interval_back(daemons, tmp_path):
    h = run(daemons, tmp_path / "off", enabled=False)
    atts = h["attempts"]
    assert [a["cause"] for a in atts] == ["nan", None]
    assert not [e for e in h["events"] if e["event"] == "divergence_precursor"]
    assert atts[1]["resume_step"] == 200
