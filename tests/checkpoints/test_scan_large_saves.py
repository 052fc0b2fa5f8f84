"""A big checkpoint is not a hostile one (issue 34, never harm the run): the pickle scan's bounds
must pass the largest healthy saves, since a checkpoint the scan does not call checked is not
ready, and the daemon may then restart from scratch or give up over it. Real saves made by torch
in a subprocess: a DCP save of 40,000 storage entries (its ``.metadata`` alone is 4.3 million
opcodes, past the 2 million the whole checkpoint had), a torch zip of 50,000 parameters with their
Adam state (6 million opcodes), an HF folder of 3,000 ``.bin`` shards (past the 1,024 pickle files
the walk read): each is ready. Then hostile ``.metadata`` past its own bound, or holding what no
DCP save holds: refused with the reason, in bounded memory and time."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from supervisor.checkpoints import dcpscan, picklescan
from supervisor.checkpoints.picklescan import scan_refusal
from tests.conftest import ROOT
from tests.helpers.ckpt_factory import old_mtime
from tests.test_child_budgets import peak_of

DCP = """
import sys, warnings, torch
import torch.distributed.checkpoint as dcp
warnings.simplefilter("ignore")
n = int(sys.argv[2])
dcp.save({"model": {f"layers.{i // 8}.block.p{i % 8}.weight": torch.zeros(2) for i in range(n)}, "step": 7},
         checkpoint_id=sys.argv[1])
"""

ZIP = """
import sys, torch
n = int(sys.argv[2])
opt = {"state": {i: {"step": torch.tensor(1.0), "exp_avg": torch.zeros(2), "exp_avg_sq": torch.zeros(2)}
                 for i in range(n)},
       "param_groups": [{"lr": 0.1, "betas": (0.9, 0.99), "params": list(range(n))}]}
torch.save({"model": {f"layers.{i}.w": torch.zeros(2) for i in range(n)}, "optimizer": opt, "step": 3}, sys.argv[1])
"""

SHARDS = """
import json, os, sys, torch
d, n = sys.argv[1], int(sys.argv[2])
os.makedirs(d)
for i in range(n):
    torch.save({f"model.layers.{i}.w": torch.zeros(2)}, f"{d}/pytorch_model-{i + 1:05d}-of-{n:05d}.bin")
json.dump({"global_step": 30}, open(f"{d}/trainer_state.json", "w"))
"""


def _torch(script: str, *args: object) -> None:
    subprocess.run([sys.executable, "-c", script, *map(str, args)], check=True, timeout=600, capture_output=True)


def _timed(fn):  # (value, seconds)
    t0 = time.monotonic()
    value = fn()
    return value, time.monotonic() - t0


@pytest.mark.slow
def test_a_dcp_save_of_40000_entries_is_ready(tmp_path: Path) -> None:
    ck, sd = tmp_path / "ck", tmp_path / "state"
    sd.mkdir()
    _torch(DCP, ck / "step-10", 40_000)
    old_mtime(ck / "step-10")
    got, took = _timed(lambda: scan_refusal(ck / "step-10"))
    assert got is None and took < 120, (got, took)  # about 4 s of CPU here, unloaded
    cp = subprocess.run([sys.executable, "-m", "supervisor", "checkpoints", "--checkpoint-dir", str(ck),
                         "--state-dir", str(sd), "--json"], cwd=str(ROOT), capture_output=True, text=True, timeout=600)
    assert cp.returncode == 0, cp.stderr
    (row,) = json.loads(cp.stdout)
    assert row["ready"] and not any("pickle scan" in r for r in row["reasons"]), row


@pytest.mark.slow
def test_a_torch_zip_of_50000_parameters_with_adam_state_and_3000_shards_pass(tmp_path: Path) -> None:
    _torch(ZIP, tmp_path / "big.pt", 50_000)
    got, took = _timed(lambda: scan_refusal(tmp_path / "big.pt"))
    assert got is None and took < 120, (got, took)  # 6 million opcodes: about 5 s here
    _torch(SHARDS, tmp_path / "checkpoint-30", 3_000)
    got, took = _timed(lambda: scan_refusal(tmp_path / "checkpoint-30"))
    assert got is None and took < 60, (got, took)  # about 0.5 s here


def _metadata(folder: Path, body: bytes) -> Path:
    folder.mkdir()
    (folder / ".metadata").write_bytes(b"\x80\x04" + body + b".")
    (folder / "__0_0.distcp").write_bytes(b"\x80\x04K\x01.")
    return folder


def test_a_metadata_past_its_own_opcode_bound_is_refused_in_bounded_memory(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound lowered to 100,000 opcodes, a .metadata 100x past it (10 million: a list of
    Nones): refused by the walk with the bound named, before any stand-in is built."""
    monkeypatch.setattr(picklescan, "METADATA_OPCODES", 100_000)
    folder = _metadata(tmp_path / "many", b"(" + b"N" * 10_000_000 + b"l")
    (got, peak), took = _timed(lambda: peak_of(lambda: scan_refusal(folder)))
    assert got is not None and got.file == ".metadata", got
    assert "more than 100,000 pickle opcodes to walk (the scan's bound)" in got.why, got
    assert "not called checked" in got.why and peak < 24 << 20 and took < 30, (got, peak, took)


def test_a_metadata_of_sets_is_refused_before_it_is_built(tmp_path: Path) -> None:
    """A set is about 200 bytes built from one opcode byte: 3 million of them (600 MB once built)
    within the opcode bound; no DCP save holds a set, so the walk refuses the first one."""
    folder = _metadata(tmp_path / "sets", b"(" + b"\x8f" * 3_000_000 + b"l")
    (got, peak), took = _timed(lambda: peak_of(lambda: scan_refusal(folder)))
    assert got is not None and got.file == ".metadata" and "EMPTY_SET opcode" in got.why, got
    assert peak < 16 << 20 and took < 30, (peak, took)


def test_the_metadata_budget_is_its_own() -> None:
    """The checkpoint's budget is not spent on .metadata, nor the other way round: each is sized
    for the largest real saves of its kind (docs/reliability.md, the budget table)."""
    assert picklescan.METADATA_OPCODES == dcpscan.METADATA_OPCODES >= 4_500_000  # 40,000 entries and more
    assert picklescan.Budget().max_ops >= 6_000_000  # 50,000 parameters with their Adam state
