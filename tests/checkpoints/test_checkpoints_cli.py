"""`transformer-supervisor checkpoints [--json]`: the readiness quicklist from the command line."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT
from tests.helpers import ckpt_factory as f

SPEC_KEYS = {"path", "step", "exists", "complete", "sha256_ok", "config_matches", "config_diff", "val_metric",
             "load_test", "ready", "reasons"}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", "checkpoints", *args], cwd=str(ROOT),
                          capture_output=True, text=True, timeout=120)


def test_json_table_newest_first_with_reasons(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    from supervisor.client import save_checkpoint

    for step in (100, 200, 300):
        save_checkpoint(f.state(step), ck / f"step_{step:06d}.pt", step=step, config={"lr": 3e-4},
                        metrics={"val_loss": {"value": 2.0 - step / 1000, "step": step}})
    f.truncate(ck / "step_000300.pt")
    for p in ck.iterdir():
        f.old_mtime(p)
    cp = cli("--checkpoint-dir", str(ck), "--state-dir", str(tmp_path / "state"), "--json")
    assert cp.returncode == 0, cp.stderr
    rows = json.loads(cp.stdout)
    assert [r["step"] for r in rows] == [300, 200, 100]
    for r in rows:
        assert SPEC_KEYS <= set(r)
    bad, good = rows[0], rows[1]
    assert bad["ready"] is False and bad["complete"] is False and bad["reasons"]
    assert good["ready"] is True and good["reasons"] == [] and good["load_test"]["passed"] is True
    assert good["sha256_ok"] is True and good["exists"] and good["complete"]
    assert good["val_metric"] == {"name": "val_loss", "value": 1.8, "step": 200}
    # Read-only: the CLI moves and writes nothing in the checkpoint dir.
    assert sorted(p.name for p in ck.iterdir()) == sorted(
        [f"step_{s:06d}.pt" for s in (100, 200, 300)] + [f"step_{s:06d}.pt.manifest.json" for s in (100, 200, 300)])
    human = cli("--checkpoint-dir", str(ck), "--state-dir", str(tmp_path / "state"))
    assert human.returncode == 0 and "step_000300.pt" in human.stdout and "No" in human.stdout


def test_missing_dir_is_a_usage_error(tmp_path):
    cp = cli("--checkpoint-dir", str(tmp_path / "nope"), "--json")
    assert cp.returncode == 2 and "nope" in cp.stderr


def test_the_dir_named_in_the_configs_command_is_listed_without_a_checkpoint_dir(tmp_path):
    out = tmp_path / "out"
    f.torch_file(out / "step_100.pt", 100)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[job]\ncommand = ["python", "train.py", "--output_dir", "out"]\nworkdir = "{tmp_path}"\n'
                   f'[state]\ndir = "{tmp_path / "state"}"\n[checkpoints]\nload_test = false\n')
    cp = cli("--config", str(cfg), "--json")
    assert cp.returncode == 0, cp.stderr
    assert [r["path"] for r in json.loads(cp.stdout)] == [str(out / "step_100.pt")]
    cfg.write_text(f'[job]\ncommand = ["python", "train.py"]\nworkdir = "{tmp_path}"\n')
    cp = cli("--config", str(cfg), "--json")
    assert cp.returncode == 2 and "--output_dir" in cp.stderr
