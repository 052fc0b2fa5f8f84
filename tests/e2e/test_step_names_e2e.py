"""Issue 34 D2 through the real daemon: the step is the number after a step-like word, so of
step_900.pt and step_1000_v2.pt (once step 2) the newer is handed to the job."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import history
from tests.helpers.ckpt_factory import torch_file


@pytest.mark.slow
def test_the_daemon_resumes_from_the_newest_of_a_v2_suffixed_name(daemons, tmp_path: Path) -> None:
    """Through the real daemon: step_900.pt (older) and step_1000_v2.pt (newer); the job is
    handed step_1000_v2.pt (it was handed step_900.pt, 100 steps lost)."""
    sd, ck, out = tmp_path / "sd", tmp_path / "ck", tmp_path / "resumed"
    torch_file(ck / "step_900.pt", 900)
    torch_file(ck / "step_1000_v2.pt", 1000)
    record = ("import os, sys, json; open(sys.argv[1], 'w').write(json.dumps("
              "[os.environ.get('TSUP_RESUME_FROM', ''), sys.argv]))")
    d = daemons(["wrap", "--state-dir", str(sd), "--backoff", "0", "--checkpoint-dir", str(ck), "--"]
                + [sys.executable, "-c", record, str(out)])
    assert d.wait(90) == 0, d.stderr()[-3000:]
    frm, _ = json.loads(out.read_text())
    assert Path(frm).name == "step_1000_v2.pt", frm
    assert [Path(a["checkpoint"]).name for a in history(sd)["attempts"]] == ["step_1000_v2.pt"]
