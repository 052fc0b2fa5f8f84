"""The layout registry is the only place that lists checkpoint layouts: every spec has a factory
case and round-trips discover -> verify -> quarantine; the load-test child dispatches on the
load kind it is sent, never on a guess."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from supervisor.checkpoints import _loadtest_script as child
from supervisor.checkpoints.config import CheckpointsConfig
from supervisor.checkpoints.discovery import classify
from supervisor.checkpoints.inprogress import in_progress
from supervisor.checkpoints.layouts import registry
from supervisor.checkpoints.layouts.spec import Layout, LayoutSpec, LoadKind
from supervisor.checkpoints.manifest import manifest_path
from supervisor.checkpoints.quarantine import quarantine
from supervisor.checkpoints.service import CheckpointService
from tests.conftest import ROOT
from tests.helpers import ckpt_factory as F

CFG = CheckpointsConfig(settle_s=1.0)
NOT_FORMATS = {Layout.CUSTOM, Layout.LAST_GOOD}  # where a checkpoint came from, not how it is stored
STEP = 1200


def make(tmp_path: Path, cfg: CheckpointsConfig) -> CheckpointService:
    (tmp_path / "state").mkdir(exist_ok=True)
    return CheckpointService(cfg, tmp_path / "ck", tmp_path / "state", sys.executable, ["python", "train.py"], tmp_path)


def test_every_layout_has_one_spec_and_a_factory_case() -> None:
    layouts = [s.layout for s in registry.SPECS]
    assert len(layouts) == len(set(layouts)), "one spec per layout"
    assert set(layouts) == set(Layout) - NOT_FORMATS, "every format layout has its spec in registry.SPECS"
    assert set(F.LAYOUT_CASES) == set(layouts), "every spec has its maker in ckpt_factory.LAYOUT_CASES"


def test_every_load_kind_has_its_loader_in_the_child() -> None:
    assert set(child.LOADERS) == {str(k) for k in LoadKind}
    assert {s.load for s in registry.SPECS} <= set(LoadKind)


def test_the_child_is_told_what_to_load_and_never_guesses(tmp_path: Path) -> None:
    p = F.torch_file(tmp_path / "step_5.pt", 5)
    res = child.run({"path": str(p)})  # no "load": refused, even for an obvious .pt
    assert not res["passed"] and "unknown load kind None" in res["error"]
    res = child.run({"path": str(p), "load": "safetensors"})  # what it is told, not what the name says
    assert not res["passed"] and "not safetensors" in res["error"]


def test_the_child_script_and_the_registry_import_without_torch() -> None:
    code = ("import sys, supervisor.checkpoints._loadtest_script, supervisor.checkpoints.layouts.registry, "
            "supervisor.checkpoints.service; print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.replace("'", '"')) == []


@pytest.mark.parametrize("spec", registry.SPECS, ids=lambda s: str(s.layout))
def test_every_layout_round_trips_discover_verify_quarantine(tmp_path: Path, spec: LayoutSpec) -> None:
    ck = tmp_path / "ck"
    path = F.LAYOUT_CASES[spec.layout](ck, STEP)
    svc = make(tmp_path, replace(CFG, load_test=False))
    [cand] = svc.scan()
    assert (cand.path, cand.layout) == (path, spec.layout) and cand.step in (STEP, None)
    assert spec.folder == path.is_dir() and registry.load_kind(path, cand.layout) is spec.load
    row = svc.evaluate(cand)
    assert row.ready and row.complete and row.layout == spec.layout, row.reasons
    assert manifest_path(path).exists(), "verification wrote the supervisor's manifest"
    rec = quarantine(path, "round trip", cand.layout)
    assert not path.exists() and rec.dest.exists() and rec.dest.is_dir() == spec.folder
    assert all(not side.exists() for side in spec.sidecars(path)), "sidecars move with it"
    assert manifest_path(rec.dest).exists() and json.loads(rec.note.read_text())["reason"] == "round trip"
    assert svc.scan() == [] and in_progress(ck) == []


@pytest.mark.slow
@pytest.mark.parametrize("spec", registry.SPECS, ids=lambda s: str(s.layout))
def test_every_layout_passes_its_load_test_and_reports_its_step(tmp_path: Path, spec: LayoutSpec) -> None:
    path = F.LAYOUT_CASES[spec.layout](tmp_path / "ck", STEP)
    row = make(tmp_path, CFG).quicklist()[0]
    assert row.path == path and row.ready and row.step == STEP, row.reasons
    assert row.load_test is not None and row.load_test.passed


def test_incomplete_layouts_are_listed_as_being_written_with_what_is_missing(tmp_path: Path) -> None:
    hf = tmp_path / "checkpoint-300"  # HF before trainer_state.json
    hf.mkdir()
    (hf / "model.safetensors").write_bytes(b"\0" * 16)
    dcp = tmp_path / "step-60"  # DCP shards before .metadata
    dcp.mkdir()
    (dcp / "__0_0.distcp").write_bytes(b"x")
    assert classify(hf) is None and classify(dcp) is None
    why = {w.path.name: w.reason for w in in_progress(tmp_path)}
    assert "trainer_state.json" in why["checkpoint-300"] and ".metadata" in why["step-60"]
    (dcp / ".metadata").write_bytes(b"")
    (tmp_path / "iter_0000070").mkdir()  # Megatron-core torch_dist: a DCP save in an iter_N folder
    (tmp_path / "iter_0000070" / ".metadata").write_bytes(b"")
    assert classify(dcp) == (Layout.DCP, 60) and classify(tmp_path / "iter_0000070") == (Layout.DCP, 70)


def test_a_custom_entry_is_loaded_as_what_it_is(tmp_path: Path) -> None:
    folder = tmp_path / "run-10"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(b"w")
    shard = tmp_path / "model-00001-of-00002.safetensors"  # a shard: no layout of its own
    shard.write_bytes(b"s")
    assert registry.load_kind(folder, Layout.CUSTOM) is LoadKind.FOLDER
    assert registry.load_kind(folder / "weights.bin", Layout.CUSTOM) is LoadKind.TORCH
    assert registry.load_kind(shard, Layout.CUSTOM) is LoadKind.SAFETENSORS
