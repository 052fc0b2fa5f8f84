"""The checkpoint interval advice through the real daemon: a job that saves every 20 steps (each
save costs it about 0.4 s) and crashes once; `status` then shows the measured save cost, the
failure rate and the interval that maximises goodput (core/interval.py, checkpoints/cadence.py);
so does the run report once it has ended (report/collect.py)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.core.interval import daly_interval
from tests.conftest import ROOT
from tests.e2e.test_discovery_e2e import status_of
from tests.util import wait_for

PY = sys.executable

JOB = """
import os, sys, time
from pathlib import Path
ck, stop = Path(sys.argv[1]), Path(sys.argv[2])
ck.mkdir(exist_ok=True)
attempt = int(os.environ["TSUP_ATTEMPT"])
i = 0
while not stop.exists():
    i += 1
    time.sleep(0.05)
    print(f"iter {i}: loss {3.0 - i * 1e-4:.4f}, time 50.00ms, mfu 0.00%", flush=True)
    if i % 20 == 0:
        time.sleep(0.4)  # what the save costs the job
        (ck / f"a{attempt}_step_{i:05d}.pt").write_bytes(b"x" * 64)
    if attempt == 0 and i == 50:
        sys.exit(1)
"""


@pytest.mark.slow
def test_status_advises_the_checkpoint_interval_from_the_measured_save_cost_and_failure_rate(daemons, tmp_path: Path):
    ck, sd, stop = tmp_path / "ck", tmp_path / "sd", tmp_path / "stop"
    cfg = tmp_path / "tsup.toml"
    cfg.write_text('[checkpoints]\nglob = "a*_step_*.pt"\nstep_regex = "step_(\\\\d+)"\nload_test = false\n')
    d = daemons(["wrap", "--state-dir", str(sd), "--backoff", "0", "--config", str(cfg), "--checkpoint-dir", str(ck),
                 "--", PY, "-c", JOB, str(ck), str(stop)])
    try:
        st = wait_for(lambda: (s := status_of(sd, d)) and s.get("checkpoint_interval") and s, 90, 0.5,
                      "checkpoint_interval in status")
        plain = subprocess.run([PY, "-m", "supervisor", "status", "--state-dir", str(sd)], cwd=ROOT,
                               capture_output=True, text=True, timeout=60)
    finally:
        stop.touch()
    ci = st["checkpoint_interval"]
    assert ci["failures"] == 1 and ci["mtbf_s"] > 0
    assert 0.2 <= ci["save_cost_s"] <= 3.0, ci  # 0.4 s of sleep around each save, on a loaded machine
    # (the JSON rounds its inputs: the advice is checked against them within that rounding)
    assert ci["advised_s"] == pytest.approx(daly_interval(ci["save_cost_s"], ci["mtbf_s"]), rel=0.1, abs=0.2)
    assert "would cost" in ci["summary"] and "1 failure(s)" in ci["summary"]
    assert plain.returncode == 0 and "would cost" in plain.stdout, plain.stdout + plain.stderr
    assert d.wait(60) == 0, d.stderr()[-3000:]
    # The run report carries the same advice, read back from the ledger and the folder (build 5).
    rep = subprocess.run([PY, "-m", "supervisor", "report", "--state-dir", str(sd), "--out", str(tmp_path / "rep")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert rep.returncode == 0, rep.stdout + rep.stderr
    page = (tmp_path / "rep" / "report.html").read_text()
    section = page[page.index("<h3>Checkpoint interval</h3>"):]
    assert "would cost" in section and "1 counted failure(s)" in section, section[:2000]

