"""Readiness is the whole gate's verdict everywhere it is shown (issue 34, checkpoint safety): a
file the pickle scan refused keeps its checkpoint from being ready in the `checkpoints` verb, its
JSON, the report and the daemon's own choice alike, with the reason "pickle scan refused <file>:
<why>", whatever the load test of the folder's weights says. An HF folder's ``rng_state.npy``
object array and a ``.pkl.gz`` whose pickle names a code gadget outside the scan's deny list
(numpy.testing's ``runstring``, an exec) passed as ready while the overlap hand-over refused
them. The one exception: a torch file the load test itself loaded with ``weights_only=True``
(torch's own allowlist read that very file): kept for a torch newer than the scan's table (which
equals torch 2.13's: tests/checkpoints/test_picklenames.py), shown here by taking float8_e8m0fnu
out of the table as a newer dtype would be missing from it."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.checkpoints import picklenames
from supervisor.checkpoints.config import CheckpointsConfig
from supervisor.checkpoints.picklescan import unsafe_pickle
from supervisor.checkpoints.resumechoice import choose_for_resume
from supervisor.checkpoints.service import CheckpointService
from supervisor.config.model import load_config
from supervisor.job.launch import config_json
from supervisor.ledger.store import Ledger
from tests.conftest import ROOT
from tests.helpers.ckpt_factory import old_mtime

MAKE = """
import gzip, json, os, pickle, sys, numpy as np, torch
from safetensors.torch import save_file
ck, marker = sys.argv[1], sys.argv[2]
class Gadget:  # an exec the deny list does not name: only the allowlist refuses it
    def __reduce__(self):
        from numpy.testing._private.utils import runstring
        return (runstring, ("import os; os.system('touch %s')" % marker, {}))
def folder(step):
    d = os.path.join(ck, f"checkpoint-{step}")
    os.makedirs(d)
    save_file({"w": torch.ones(4)}, os.path.join(d, "model.safetensors"))
    json.dump({"global_step": step}, open(os.path.join(d, "trainer_state.json"), "w"))
    return d
folder(20)
np.save(os.path.join(folder(40), "rng_state.npy"), np.array([Gadget()], dtype=object), allow_pickle=True)
with gzip.open(os.path.join(folder(60), "extra.pkl.gz"), "wb") as f:
    pickle.dump(Gadget(), f)
d = folder(80)  # a dtype torch's weights-only load accepts (the scan's table has it)
torch.save({"scales": torch.zeros(4, dtype=torch.uint8).view(torch.float8_e8m0fnu)}, os.path.join(d, "scales.pt"))
# the careless loads the job would do, shown to run the payload (on copies, the marker removed after)
np.load(os.path.join(ck, "checkpoint-40", "rng_state.npy"), allow_pickle=True)
assert os.path.exists(marker); os.remove(marker)
pickle.load(gzip.open(os.path.join(ck, "checkpoint-60", "extra.pkl.gz")))
assert os.path.exists(marker); os.remove(marker)
"""


def _make(tmp_path: Path) -> tuple[Path, Path, Path]:
    ck, sd, marker = tmp_path / "ck", tmp_path / "state", tmp_path / "RAN"
    sd.mkdir()
    subprocess.run([sys.executable, "-c", MAKE, str(ck), str(marker)], check=True, timeout=180)
    for d in ck.iterdir():
        old_mtime(d)
    return ck, sd, marker


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", *args], cwd=str(ROOT), capture_output=True,
                          text=True, timeout=300)


REFUSED = {"checkpoint-40": "pickle scan refused rng_state.npy: the pickle references "
                            "numpy.testing._private.utils.runstring, outside the tensor-rebuild allowlist",
           "checkpoint-60": "pickle scan refused extra.pkl.gz: the pickle references "
                            "numpy.testing._private.utils.runstring, outside the tensor-rebuild allowlist"}


@pytest.mark.slow
def test_the_verb_its_json_and_the_daemons_choice_say_the_scans_refusal(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    ck, sd, marker = _make(tmp_path)
    cp = _cli("checkpoints", "--checkpoint-dir", str(ck), "--state-dir", str(sd), "--json")
    assert cp.returncode == 0, cp.stderr
    rows = {Path(r["path"]).name: r for r in json.loads(cp.stdout)}
    for name, why in REFUSED.items():
        assert rows[name]["ready"] is False and rows[name]["reasons"][0] == why, rows[name]
        # the weights' load test passed, the scan decided: shown refused, never as passed
        lt = rows[name]["load_test"]
        assert lt["loaded"] and lt["passed"] is False and lt["refused"] == why == lt["error"], lt
    assert rows["checkpoint-20"]["ready"] and rows["checkpoint-20"]["reasons"] == []
    assert rows["checkpoint-80"]["ready"] and rows["checkpoint-80"]["reasons"] == [], rows["checkpoint-80"]
    # the table and the progress lines say the same, the reason first
    cp = _cli("checkpoints", "--checkpoint-dir", str(ck), "--state-dir", str(sd))
    assert cp.returncode == 0, cp.stderr
    for name, why in REFUSED.items():
        assert re.search(rf"^\S+\s+No\s.*{name}$", cp.stdout, re.M), cp.stdout
        assert f"  {name}: No: {why}" in cp.stdout
        assert f"{name}: not ready: {why}" in cp.stderr
    # the daemon's own choice: past 80 (ready), never 60 or 40 once 80 is gone. float8_e8m0fnu taken
    # out of the scan's table (a torch newer than it): 80 is still ready, its load test read scales.pt
    # with weights_only=True, so torch's own allowlist accepted that very file.
    monkeypatch.setattr(picklenames, "_TORCH_DTYPES", picklenames._TORCH_DTYPES - {"float8_e8m0fnu"})
    assert unsafe_pickle(ck / "checkpoint-80") is not None
    svc = CheckpointService(CheckpointsConfig(settle_s=0.0), ck, sd, sys.executable, ["python", "train.py"], tmp_path)
    try:
        got = choose_for_resume(svc, "restart", None, overlap=False)
        assert got is not None and got.path.name == "checkpoint-80"
        (ck / "checkpoint-80").rename(tmp_path / "away")
        for overlap in (True, False):
            got = choose_for_resume(svc, "restart", None, overlap=overlap)
            assert got is not None and got.path.name == "checkpoint-20", (overlap, got)
    finally:
        svc.close()
    assert not marker.exists(), "a payload ran"
    assert (ck / "checkpoint-40" / "rng_state.npy").exists() and (ck / "checkpoint-60" / "extra.pkl.gz").exists()


def report_html(tmp_path: Path, sd: Path, ck: Path) -> str:
    """The report of a finished run on ``ck`` kept in ``sd`` (the real CLI): its checkpoint table
    reads the verdicts a verb or the daemon left, and runs no load test of its own."""
    toml = tmp_path / "c.toml"
    toml.write_text(f'[job]\ncommand = ["{sys.executable}", "train.py"]\nworkdir = "{tmp_path}"\n'
                    f'[state]\ndir = "{sd}"\n[checkpoints]\ndir = "{ck}"\nsettle_s = 0\n')
    cfg = load_config(str(toml))
    led = Ledger(sd)
    run_id, _ = led.open_run(cfg.job.name, config_json(cfg))
    led.end_run(run_id, "finished", 0, "the job exited 0")
    led.close()
    out = tmp_path / "report"
    cp = _cli("report", "--state-dir", str(sd), "--out", str(out))
    assert cp.returncode == 0, cp.stderr
    return (out / "report.html").read_text()


def test_the_report_shows_the_same_verdict_without_running_a_load_test(tmp_path: Path) -> None:
    ck, sd, marker = _make(tmp_path)
    html = report_html(tmp_path, sd, ck)
    for name, why in REFUSED.items():
        row = next(line for line in html.split("<tr>") if f"{name}</td>" in line)
        assert '<span class="fail">fail</span>' in row.split("</td>")[2] and why in row, row
    clean = next(line for line in html.split("<tr>") if "checkpoint-20</td>" in line)
    assert '<span class="pass">pass</span>' in clean.split("</td>")[2], clean
    assert not marker.exists()
