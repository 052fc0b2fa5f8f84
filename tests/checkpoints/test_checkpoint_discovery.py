"""Discovery: every layout, temp names, files still growing (injected clock), ignored folders."""
from __future__ import annotations

import os
import time
from pathlib import Path

from supervisor.checkpoints.discovery import Discovery, Layout, classify
from tests.helpers import ckpt_factory as F


def _by_name(cands):
    return {c.path.name: (c.layout, c.step) for c in cands}


def test_every_layout_found_with_its_step(tmp_path: Path) -> None:
    F.torch_file(tmp_path / "step_1000.pt", 1000)
    F.torch_file(tmp_path / "ckpt_00002000.pt", 2000)
    F.safetensors_file(tmp_path / "model_300.safetensors")
    F.hf_folder(tmp_path, 500)
    F.dcp_folder(tmp_path, 700)
    F.megatron_folder(tmp_path, 1500)
    F.lightning(tmp_path, 0, 400)
    F.lightning(tmp_path, 0, 400, name="last.ckpt")
    F.nanogpt(tmp_path / "nano", 42)
    found = _by_name(Discovery(tmp_path, settle_s=5).scan())
    assert found == {
        "step_1000.pt": (Layout.FILE, 1000),
        "ckpt_00002000.pt": (Layout.FILE, 2000),
        "model_300.safetensors": (Layout.SAFETENSORS, 300),
        "checkpoint-500": (Layout.HF, 500),
        "step-700": (Layout.DCP, 700),
        "iter_0001500": (Layout.MEGATRON, 1500),
        "epoch=0-step=400.ckpt": (Layout.LIGHTNING, 400),
        "last.ckpt": (Layout.LIGHTNING, None),
    }
    nano = Discovery(tmp_path / "nano", settle_s=5).scan()
    assert [(c.path.name, c.layout, c.step) for c in nano] == [("ckpt.pt", Layout.SINGLE, None)]


def test_newest_first_and_manifests_quarantine_ignored(tmp_path: Path) -> None:
    for s in (100, 300, 200):
        F.torch_file(tmp_path / f"step_{s}.pt", s)
    (tmp_path / "step_300.pt.manifest.json").write_text("{}")
    (tmp_path / "quarantine").mkdir()
    F.torch_file(tmp_path / "quarantine" / "step_900.pt", 900)
    cands = Discovery(tmp_path, settle_s=5).scan()
    assert [c.step for c in cands] == [300, 200, 100]
    assert all(c.size > 0 and c.mtime > 0 for c in cands)


def test_temp_names_and_incomplete_dcp_are_not_candidates(tmp_path: Path) -> None:
    for name in (".step_10.pt.123.tmp", "step_20.pt.tmp", "step_30.pt.partial", "tmp-checkpoint-40",
                 ".step_50.pt.partial"):
        p = tmp_path / name
        p.write_bytes(b"x" * 10)
        F.old_mtime(p)
    d = tmp_path / "step-60"  # DCP shards written, .metadata not yet
    d.mkdir()
    (d / "__0_0.distcp").write_bytes(b"x")
    F.old_mtime(d)
    assert Discovery(tmp_path, settle_s=1).scan() == []
    assert classify(tmp_path / "step_20.pt.tmp") is None


def test_file_still_growing_is_skipped_until_it_settles(tmp_path: Path) -> None:
    now = [time.time()]
    disc = Discovery(tmp_path, settle_s=10, clock=lambda: now[0])
    p = tmp_path / "step_5.pt"
    p.write_bytes(b"a" * 100)  # mtime is now: inside the settle window
    assert disc.scan() == [] and disc.unsettled == (p,)
    now[0] += 20
    with open(p, "ab") as f:  # still growing, and its mtime is old by the clock
        f.write(b"b" * 100)
    os.utime(p, (now[0] - 60, now[0] - 60))
    assert disc.scan() == [], "size changed since the previous scan"
    now[0] += 20
    assert [c.step for c in disc.scan()] == [5]


def test_configured_glob_and_step_regex(tmp_path: Path) -> None:
    for s in (10, 20):
        d = tmp_path / f"run-{s}"
        d.mkdir()
        p = d / "weights.bin"
        p.write_bytes(b"w")
        F.old_mtime(p)
    cands = Discovery(tmp_path, glob="run-*/weights.bin", step_regex=r"run-(\d+)/", settle_s=1).scan()
    assert [(c.layout, c.step) for c in cands] == [(Layout.CUSTOM, 20), (Layout.CUSTOM, 10)]
