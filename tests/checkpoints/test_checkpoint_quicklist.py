"""The readiness quicklist on real tiny torch checkpoints: every layout and every way to fail."""
from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from supervisor.checkpoints.config import CheckpointsConfig
from supervisor.checkpoints.manifest import manifest_path, read_manifest
from supervisor.checkpoints.quicklist import config_diff, parse_launch_args, render_table
from supervisor.checkpoints.service import CheckpointService
from supervisor.client._checkpoint import save_checkpoint
from tests.helpers import ckpt_factory as F

SPEC_KEYS = {"path", "step", "exists", "complete", "sha256_ok", "config_matches", "config_diff", "val_metric",
             "load_test", "ready", "reasons"}
CFG = CheckpointsConfig(settle_s=1.0, expected_keys=("model", "optimizer"))
NO_LOAD = replace(CFG, load_test=False)  # where the load test is not the subject: each one costs ~2 s


def svc(tmp_path: Path, cfg: CheckpointsConfig = CFG, argv: tuple[str, ...] = ("python", "train.py")) -> CheckpointService:
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    return CheckpointService(cfg, tmp_path / "ck", state, sys.executable, argv, tmp_path)


def saved(tmp_path: Path, step: int, **kw: object) -> Path:
    p = save_checkpoint(F.state(step, nan=bool(kw.pop("nan", False))), tmp_path / "ck" / f"step_{step}.pt",
                        step=step, **kw)  # type: ignore[arg-type]
    F.old_mtime(p)
    return p


def test_client_save_writes_manifest_and_row_is_ready_in_spec_shape(tmp_path: Path) -> None:
    p = saved(tmp_path, 500, config={"lr": 0.001, "model": {"n_layer": 2}}, metrics={"val_loss": 2.1}, seed=1234)
    m = json.loads(manifest_path(p).read_text())
    assert m["step"] == 500 and m["size"] == p.stat().st_size and len(m["sha256"]) == 64
    assert m["metrics"] == {"val_loss": {"value": 2.1, "step": 500}} and m["origin"] == "client"
    assert m["environment"]["torch"] == torch.__version__ and m["environment"]["seed"] == 1234
    assert m["config_sha256"] and m["created_at"]
    assert not list((tmp_path / "ck").glob(".*tmp")), "no temp file left behind"
    rows = svc(tmp_path, argv=("python", "train.py", "--lr=0.001")).quicklist()
    assert len(rows) == 1
    j = rows[0].to_json()
    assert SPEC_KEYS <= set(j)
    assert j["ready"] is True and j["reasons"] == [] and j["sha256_ok"] is True and j["config_matches"] is True
    assert j["val_metric"] == {"name": "val_loss", "value": 2.1, "step": 500}
    assert j["load_test"]["passed"] is True and j["load_test"]["error"] is None and j["load_test"]["seconds"] >= 0
    assert j["step"] == 500 and json.loads(json.dumps(j)) == j


def test_flipped_byte_and_truncated_file_are_not_ready(tmp_path: Path) -> None:
    a, b = saved(tmp_path, 100), saved(tmp_path, 200)
    F.flip_byte(a)
    F.truncate(b)
    rows = {r.step: r for r in svc(tmp_path, NO_LOAD).quicklist()}
    assert rows[100].sha256_ok is False and not rows[100].ready
    assert any("sha256 mismatch" in r for r in rows[100].reasons)
    assert rows[200].complete is False and not rows[200].ready
    assert any("truncated" in r for r in rows[200].reasons)


def test_a_truncated_file_is_rejected_by_its_structure_before_any_load_test(tmp_path: Path) -> None:
    # No manifest (a job that does not use the client): the cut-short zip is not ready on its
    # structural check alone; no load test ran, no manifest was written for it, nothing deleted.
    p = F.torch_file(tmp_path / "ck" / "step_300.pt", 300)
    F.truncate(p, 0.6)
    size = p.stat().st_size
    row = svc(tmp_path).quicklist()[0]
    assert not row.ready and row.complete is False and row.load_test is None
    assert row.reasons[0].startswith("truncated"), row.reasons
    assert p.stat().st_size == size and not list(p.parent.glob("*.manifest*"))


def test_missing_manifest_supervisor_writes_its_own_without_touching_the_checkpoint(tmp_path: Path) -> None:
    p = F.torch_file(tmp_path / "ck" / "step_300.pt", 300)
    before = (p.read_bytes(), p.stat().st_mtime_ns)
    row = svc(tmp_path).quicklist()[0]
    assert row.ready and row.sha256_ok is True
    m = read_manifest(p).manifest
    assert m is not None and m.origin == "supervisor" and m.step == 300
    assert (p.read_bytes(), p.stat().st_mtime_ns) == before
    F.flip_byte(p)  # later bit rot (same size and mtime) is caught by that manifest once the
    # digest cache (keyed by inode, size, mtime in the state dir) no longer vouches for it
    (tmp_path / "state" / "checkpoint_digests.json").unlink()
    row2 = svc(tmp_path, NO_LOAD).quicklist()[0]
    assert row2.sha256_ok is False and not row2.ready


def test_bad_manifest_json_is_a_reason_not_a_crash(tmp_path: Path) -> None:
    p = saved(tmp_path, 10)
    manifest_path(p).write_text("{not json")
    row = svc(tmp_path, NO_LOAD).quicklist()[0]
    assert not row.ready and any("not valid JSON" in r for r in row.reasons)


def test_config_mismatch_lists_the_diff_and_allow_list_accepts_it(tmp_path: Path) -> None:
    (tmp_path / "cfg.json").write_text(json.dumps({"optim": {"lr": 0.002}, "model": {"n_layer": 2}}))
    saved(tmp_path, 100, config={"optim": {"lr": 0.001}, "model": {"n_layer": 2}, "batch_size": 8})
    cfg = replace(NO_LOAD, job_config_file="cfg.json")
    row = svc(tmp_path, cfg, argv=("python", "train.py", "--batch-size", "16")).quicklist()[0]
    assert row.config_matches is False and not row.ready
    assert row.to_json()["config_diff"] == {"optim.lr": [0.001, 0.002], "batch_size": [8, "16"]}
    text = render_table([row])
    assert "No" in text and "optim.lr" in text
    cfg2 = replace(cfg, config_allow_diff=("optim.lr",))
    s = svc(tmp_path, cfg2, argv=("python", "train.py", "--batch-size", "16"))
    s.set_remedy_keys(["batch_size"])  # the remedy ladder halved the micro-batch
    assert s.quicklist()[0].config_matches is True


def test_nan_weights_fail_with_the_finite_check_only(tmp_path: Path) -> None:
    saved(tmp_path, 100, nan=True)
    assert svc(tmp_path).quicklist()[0].ready
    row = svc(tmp_path, replace(CFG, check_finite=True)).quicklist()[0]
    assert not row.ready and row.load_test is not None and "non-finite" in (row.load_test.error or "")
    assert "model.w" in (row.load_test.error or "")


def test_malicious_pickle_is_never_executed_and_not_ready(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    (tmp_path / "ck").mkdir()
    F.malicious(tmp_path / "ck" / "step_100.pt", marker)
    row = svc(tmp_path).quicklist()[0]
    assert not row.ready and row.load_test is not None and row.load_test.needs_pickle
    assert any("trust_pickles" in r for r in row.reasons)
    assert not marker.exists()


def test_expected_keys_missing(tmp_path: Path) -> None:
    (tmp_path / "ck").mkdir()
    torch.save({"model": {}}, tmp_path / "ck" / "step_1.pt")
    F.old_mtime(tmp_path / "ck" / "step_1.pt")
    row = svc(tmp_path).quicklist()[0]
    assert not row.ready and "missing top-level keys: optimizer" in (row.load_test.error or "")  # type: ignore[union-attr]


@pytest.mark.slow
def test_every_layout_loads_and_reports_its_step(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    F.hf_folder(ck, 500)
    F.dcp_folder(ck, 700)
    F.megatron_folder(ck, 1500)
    F.safetensors_file(ck / "model_300.safetensors")
    F.lightning(ck, 0, 400, name="last.ckpt")
    cfg = replace(CFG, expected_keys=())
    rows = svc(tmp_path, cfg).quicklist()
    got = {r.path.name: (r.step, r.ready, r.layout) for r in rows}
    assert got == {"iter_0001500": (1500, True, "megatron"), "step-700": (700, True, "dcp"),
                   "checkpoint-500": (500, True, "hf"), "last.ckpt": (400, True, "lightning"),
                   "model_300.safetensors": (300, True, "safetensors")}, [r.reasons for r in rows]
    assert [r.step for r in rows] == [1500, 700, 500, 400, 300]


def test_nanogpt_step_comes_from_iter_num_inside(tmp_path: Path) -> None:
    F.nanogpt(tmp_path / "ck", 4200)
    row = svc(tmp_path).quicklist()[0]
    assert row.step == 4200 and row.ready
    assert read_manifest(tmp_path / "ck" / "ckpt.pt").manifest.step == 4200  # type: ignore[union-attr]


def test_truncated_safetensors_and_dcp_shard(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    st = F.safetensors_file(ck / "model_300.safetensors")
    d = F.dcp_folder(ck, 700)
    s = svc(tmp_path, replace(CFG, expected_keys=(), write_manifests=False))
    F.truncate(st, 0.8)
    shard = next(d.glob("*.distcp"))
    F.truncate(shard, 0.5)
    rows = {r.path.name: r for r in s.quicklist()}
    assert not rows["model_300.safetensors"].ready and "truncated" in rows["model_300.safetensors"].reasons[0]
    assert not rows["step-700"].ready and "truncated" in rows["step-700"].reasons[0]


def test_val_metric_from_the_log_stream(tmp_path: Path) -> None:
    saved(tmp_path, 500)
    row = svc(tmp_path, NO_LOAD).quicklist(metrics_seen={"val_loss": [(250, 3.0), (500, 2.5), (750, 2.0)]})[0]
    assert row.val_metric is not None and (row.val_metric.value, row.val_metric.step) == (2.5, 500)
    strict = svc(tmp_path, replace(NO_LOAD, require_val_metric=True)).quicklist()[0]
    assert not strict.ready and any("validation metric" in r for r in strict.reasons)


def test_launch_args_and_diff_helpers() -> None:
    assert parse_launch_args(["--lr=0.1", "--batch-size", "8", "--compile", "dropout=0.1"]) == {
        "lr": "0.1", "batch_size": "8", "compile": True, "dropout": "0.1"}
    assert config_diff({"a": {"b": 1}, "c": 2}, {"a.b": "1", "c": 3, "d": 4}, allow=(), union=False) == {"c": (2, 3)}
    assert config_diff({"c": 2}, {"c": 2, "d": 4}, allow=(), union=True) == {"d": (None, 4)}


def test_save_checkpoint_fails_fast_on_misuse(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        save_checkpoint({}, tmp_path / "x.pt", step="10")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        save_checkpoint({}, tmp_path / "x.pt", step=1, config=[1, 2])  # type: ignore[arg-type]
    assert not list(tmp_path.iterdir())
