"""`checkpoints` on a finished run's state dir (issue 23 build 6): one warm load-test process for
the whole list, a progress line per checkpoint, `--no-load-test`, and the config compared against
the command the ledger recorded (or "no command known"), with the daemon's service's verdicts."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.checkpoints.service import CheckpointService
from supervisor.config.model import Config, load_config
from supervisor.job.launch import config_json
from supervisor.ledger.store import Ledger
from tests.conftest import ROOT
from tests.helpers import ckpt_factory as f

N = 12


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", "checkpoints", *args], cwd=str(ROOT),
                          capture_output=True, text=True, timeout=300)


def finished_run(tmp_path: Path) -> tuple[Path, Path, Config]:
    """12 small torch checkpoints with manifests whose config snapshot holds the launch args, a
    truncated one and one saved with another learning rate, and a ledger that recorded the run."""
    from supervisor.client import save_checkpoint

    ck, sd = tmp_path / "ck", tmp_path / "state"
    ck.mkdir()
    sd.mkdir()
    for i in range(N):
        step = (i + 1) * 100
        lr = 3e-4 if i != 4 else 1e-3
        save_checkpoint(f.state(step), ck / f"step_{step:06d}.pt", step=step, config={"lr": lr},
                        metrics={"val_loss": {"value": 2.0 - step / 10000, "step": step}})
    f.truncate(ck / "step_000300.pt")
    for p in ck.iterdir():
        f.old_mtime(p)
    toml = tmp_path / "c.toml"
    toml.write_text(f'[job]\ncommand = ["{sys.executable}", "train.py", "--lr", "3e-4"]\nworkdir = "{tmp_path}"\n'
                    f'[state]\ndir = "{sd}"\n[checkpoints]\ndir = "{ck}"\n')
    cfg = load_config(str(toml))
    led = Ledger(sd)
    run_id, _ = led.open_run(cfg.job.name, config_json(cfg))
    led.end_run(run_id, "finished", 0, "the job exited 0")
    led.close()
    return ck, sd, cfg


def daemon_verdicts(ck: Path, sd: Path, cfg: Config) -> dict[str, tuple[bool, list[str]]]:
    """What the daemon's service (the job's command known) says about each checkpoint, load-testing
    each itself: on a copy of the state dir without the verdicts the CLI persisted."""
    own = sd.with_name(sd.name + "-daemon")
    shutil.copytree(sd, own, ignore=shutil.ignore_patterns("checkpoint_loadtests.json"))
    svc = CheckpointService(cfg.checkpoints, ck, own, None, list(cfg.job.command), cfg.workdir(),
                            write_manifests=False)
    try:
        return {str(r.path): (r.ready, list(r.reasons)) for r in svc.quicklist()}
    finally:
        svc.close()


@pytest.mark.slow
def test_state_dir_of_a_finished_run_gives_the_daemons_verdicts_with_progress(tmp_path):
    ck, sd, cfg = finished_run(tmp_path)
    cp = cli("--checkpoint-dir", str(ck), "--state-dir", str(sd), "--json")
    assert cp.returncode == 0, cp.stderr
    rows = json.loads(cp.stdout)
    got = {r["path"]: (r["ready"], r["reasons"]) for r in rows}
    assert got == daemon_verdicts(ck, sd, cfg)
    assert sum(ready for ready, _ in got.values()) == N - 2
    assert got[str(ck / "step_000500.pt")][0] is False and "lr" in got[str(ck / "step_000500.pt")][1][0]
    assert all(r["load_test"]["passed"] for r in rows if r["ready"])
    progress = [line for line in cp.stderr.splitlines() if line.startswith("checkpoints: [")]
    assert len(progress) == N, cp.stderr
    assert f"[{N}/{N}]" in progress[-1]
    assert any("step_000300.pt: not ready" in line for line in progress)
    # The verdicts are persisted in the state dir: a second look reuses them (same seconds, the
    # time the first test took), and a rewrite that puts the mtime back is tested again.
    stored = json.loads((sd / "checkpoint_loadtests.json").read_text())
    assert len(stored) == N - 1  # the truncated one is never load-tested
    one = ck / "step_000100.pt"
    st = one.stat()
    one.write_bytes(one.read_bytes())
    os.utime(one, ns=(st.st_atime_ns, st.st_mtime_ns))
    again = json.loads(cli("--checkpoint-dir", str(ck), "--state-dir", str(sd), "--json").stdout)
    before = {r["path"]: r["load_test"] for r in rows}
    for r in again:
        if r["path"] != str(one):
            assert r["load_test"] == before[r["path"]]
    assert len(json.loads((sd / "checkpoint_loadtests.json").read_text())) == N


def test_no_command_known_is_said_not_differs(tmp_path):
    ck, _sd, _cfg = finished_run(tmp_path)
    cp = cli("--checkpoint-dir", str(ck), "--state-dir", str(tmp_path / "empty-state"), "--json", "--no-load-test")
    assert cp.returncode == 0, cp.stderr
    rows = {Path(r["path"]).name: r for r in json.loads(cp.stdout)}
    five = rows["step_000500.pt"]
    assert five["ready"] is True and five["config_matches"] is None and five["config_diff"] == {}
    assert all(r["load_test"] is None for r in rows.values())  # --no-load-test
    assert rows["step_000300.pt"]["ready"] is False
    human = cli("--checkpoint-dir", str(ck), "--state-dir", str(tmp_path / "empty-state"), "--no-load-test")
    assert human.returncode == 0 and "differs" not in human.stdout + human.stderr
