"""A checkpoint folder whose pickle names a callable that runs code is refused by the full gate
too (adversarial round 3): an HF-style folder with a sound model.safetensors and an
``rng_state.npy`` object array whose element reduces to ``os.system`` passed the weights-only load
test of its weights file and was handed to the job, whose ``np.load(allow_pickle=True)`` ran it.
A pickle that is merely outside the allowlist (HF's training_args.bin) is still load-tested."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from supervisor.checkpoints.config import CheckpointsConfig
from supervisor.checkpoints.pickledeny import runs_code
from supervisor.checkpoints.picklescan import unsafe_pickle
from supervisor.checkpoints.resumechoice import choose_for_resume
from supervisor.checkpoints.service import CheckpointService

MAKE = """
import json, os, sys, numpy as np, torch
from safetensors.torch import save_file
ck, marker = sys.argv[1], sys.argv[2]
class P:
    def __reduce__(self):
        return (os.system, ("touch " + marker,))
for step, bad in ((40, False), (60, True)):
    d = os.path.join(ck, f"checkpoint-{step}")
    os.makedirs(d)
    save_file({"w": torch.ones(4)}, os.path.join(d, "model.safetensors"))
    json.dump({"global_step": step}, open(os.path.join(d, "trainer_state.json"), "w"))
    np.save(os.path.join(d, "rng_state.npy"), np.array([P()] if bad else [1.0, 2.0], dtype=object if bad else float),
            allow_pickle=True)
"""


def test_a_folder_whose_pickle_runs_code_is_never_chosen_and_nothing_runs(tmp_path: Path) -> None:
    ck, marker = tmp_path / "ck", tmp_path / "RAN"
    subprocess.run([sys.executable, "-c", MAKE, str(ck), str(marker)], check=True, timeout=120)
    reason = unsafe_pickle(ck / "checkpoint-60")
    assert runs_code(reason) and "posix.system" in (reason or ""), reason
    assert not runs_code(unsafe_pickle(ck / "checkpoint-40"))
    (tmp_path / "state").mkdir()
    svc = CheckpointService(CheckpointsConfig(settle_s=0.0), ck, tmp_path / "state", sys.executable,
                            ["python", "train.py"], tmp_path)
    try:
        choice = choose_for_resume(svc, "restart", None, overlap=True)
        assert choice is not None and choice.path.name == "checkpoint-40", choice
        rows = {Path(r.path).name: r for r in svc.quicklist()}  # the `checkpoints` verb's list says the same
        assert not rows["checkpoint-60"].ready and any("runs code" in x for x in rows["checkpoint-60"].reasons)
        assert rows["checkpoint-40"].ready
    finally:
        svc.close()
    assert not marker.exists(), "the payload ran"
    assert (ck / "checkpoint-60" / "rng_state.npy").exists() or (ck / "quarantine").exists()  # never deleted
