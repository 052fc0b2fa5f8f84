"""The static pickle scan before an overlapped launch: a real malicious torch file is refused
(never loaded: its payload would create a marker file), a real torch.save state dict passes."""
from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

import torch

from supervisor.checkpoints.config import CheckpointsConfig
from supervisor.checkpoints.picklescan import unsafe_pickle
from supervisor.checkpoints.service import CheckpointService
from supervisor.client._checkpoint import save_checkpoint
from tests.helpers import ckpt_factory as F


class _Payload:
    """Unpickling this runs ``os.system``: the kind of file weights_only refuses."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def _malicious(path: Path, marker: Path, *, zip_format: bool = True, protocol: int = 2) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": {"w": torch.zeros(2)}, "x": _Payload(marker)}, path,
               _use_new_zipfile_serialization=zip_format, pickle_protocol=protocol)
    return path


def test_a_real_state_dict_passes_in_both_torch_formats(tmp_path: Path) -> None:
    sd = {"model": torch.nn.Linear(3, 2).state_dict(), "optimizer": {"step": torch.tensor(3.0)},
          "dtype": torch.bfloat16, "size": torch.Size([2, 3]), "step": 7}
    torch.save(sd, tmp_path / "new.pt")
    torch.save(sd, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    assert unsafe_pickle(tmp_path / "new.pt") is None
    assert unsafe_pickle(tmp_path / "old.pt") is None
    assert unsafe_pickle(tmp_path) is None, "a folder of good files passes"


def test_an_os_system_reference_is_refused_without_running_it(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    for zip_format in (True, False):
        p = _malicious(tmp_path / f"evil_{zip_format}.pt", marker, zip_format=zip_format)
        why = unsafe_pickle(p)
        assert why is not None and "system" in why and "allowlist" in why, why
    raw = tmp_path / "raw.pkl"
    raw.write_bytes(pickle.dumps(_Payload(marker), protocol=4))  # STACK_GLOBAL with memoized names
    assert unsafe_pickle(raw) is not None and "system" in (unsafe_pickle(raw) or "")
    assert unsafe_pickle(tmp_path) is not None, "a folder holding one is refused"
    assert not marker.exists(), "the scan never executes the stream"


def test_overlap_never_hands_over_an_unsafe_newest_checkpoint(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    good = save_checkpoint(F.state(100), tmp_path / "ck" / "step_100.pt", step=100)
    F.old_mtime(good)
    evil = _malicious(tmp_path / "ck" / "step_200.pt", marker)
    F.old_mtime(evil)
    (tmp_path / "state").mkdir()
    cfg = CheckpointsConfig(settle_s=1.0, expected_keys=("model", "optimizer"))
    svc = CheckpointService(cfg, tmp_path / "ck", tmp_path / "state", sys.executable, ["python", "train.py"], tmp_path)
    outcome = svc.choose("restart", None, overlap=True)
    choice = outcome.choice
    assert choice is not None and choice.path == good and choice.step == 100, choice
    assert [p for p, _ in outcome.refused] == [str(evil)]
    # The full gate load-tested it first (weights_only: refused) and took the older one; the file
    # is kept (in place or in quarantine/), never deleted, never unpickled with code.
    assert (tmp_path / "ck" / "quarantine" / "step_200.pt").exists() or evil.exists()
    assert not marker.exists()
    again = svc.choose_for_resume("restart", None, overlap=True)
    assert again is not None and again.path == good and not marker.exists()


def test_an_hf_trainer_folder_passes_the_scan(tmp_path: Path) -> None:
    """What the Trainer writes: rng_state.pth with numpy's RNG state (numpy data types, bytes in
    a protocol-2 stream), and training_args.bin, a pickle of a class the resume never reads (the
    layouts' skip list, as for the load test). Before, the scan refused such a folder and the
    newest good HF checkpoint was quarantined."""
    import argparse
    import pickle
    import random

    import numpy as np
    import torch

    folder = tmp_path / "checkpoint-10"
    folder.mkdir()
    torch.save({"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()},
               folder / "rng_state.pth")
    torch.save({"w": torch.ones(2)}, folder / "optimizer.pt")
    (folder / "training_args.bin").write_bytes(pickle.dumps(argparse.Namespace(lr=1e-3)))
    assert unsafe_pickle(folder) is None
    # The numpy allowance is for RNG state files only: the same payload as optimizer.pt is refused.
    torch.save({"numpy": np.random.get_state()}, folder / "optimizer.pt")
    assert unsafe_pickle(folder) is not None
