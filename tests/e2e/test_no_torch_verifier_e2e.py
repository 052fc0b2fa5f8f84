"""Issue 34 through the real daemon: the job's python (the interpreter the load test runs with,
since the daemon never imports torch) has no torch. Before, its load test failed with
ModuleNotFoundError, the good newest checkpoint was quarantined and the job resumed from an older
one (or from scratch). Now the test is "not tested": the job resumes from the newest on its
structural checks, nothing is moved, and the daemon says why once with what to do."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import history
from tests.helpers.ckpt_factory import torch_file

RECORD = ("import os, sys, json; open(sys.argv[1], 'w').write(json.dumps("
          "[os.environ.get('TSUP_RESUME_FROM', ''), sys.argv]))")


@pytest.mark.parametrize("verify", ["overlap", "before-launch"])
def test_a_job_python_without_torch_resumes_from_the_newest_and_moves_nothing(daemons, tmp_path: Path,
                                                                                verify: str) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    cp = subprocess.run([py, "-c", "import torch"], capture_output=True, text=True, timeout=60)
    assert cp.returncode != 0 and "No module named 'torch'" in cp.stderr, "torch must really be absent"
    sd, ck, out = tmp_path / "sd", tmp_path / "ck", tmp_path / "resumed"
    torch_file(ck / "step_10.pt", 10)
    torch_file(ck / "step_20.pt", 20)
    d = daemons(["wrap", "--state-dir", str(sd), "--backoff", "0", "--checkpoint-dir", str(ck),
                 "--set", f"checkpoints.verify={verify}", "--", py, "-c", RECORD, str(out)])
    assert d.wait(120) == 0, d.stderr()[-3000:]
    frm, _argv = json.loads(out.read_text())
    assert Path(frm).name == "step_20.pt", frm
    h = history(sd)
    assert [Path(a["checkpoint"]).name for a in h["attempts"]] == ["step_20.pt"], h["attempts"]
    assert not any(e["event"] == "checkpoint_quarantined" for e in h["events"]), h["events"]
    assert (ck / "step_10.pt").exists() and (ck / "step_20.pt").exists() and not (ck / "quarantine").exists()
    err = d.stderr()
    assert "checkpoint_load_test_untested" in err and "cannot import torch" in err, err[-3000:]
    assert "[checkpoints] python" in err and "was not load-tested" in err, err[-3000:]
