"""`checkpoints` typed from another directory than the job's, with relative paths, and a
checkpoint whose recorded validation metric is NaN (issue 37 part 5): the paths are resolved
where the operator typed them (the load tests run in the job's recorded workdir), the verdicts
are the daemon's, none of them a FileNotFoundError saved into the state dir; the NaN one is not
ready in the verb, in the report and in the daemon's choice."""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.checkpoints.service import CheckpointService
from supervisor.config.model import Config, load_config
from supervisor.job.launch import config_json
from supervisor.ledger.store import Ledger
from tests.helpers import ckpt_factory as f

STEPS = (100, 200, 300)
NAN_STEP = 300


def finished_run(tmp_path: Path) -> tuple[Path, Path, Config]:
    """Three checkpoints saved by the client (the newest with val_loss NaN), and a ledger that
    recorded the run with its workdir ``tmp_path/job``."""
    from supervisor.client import save_checkpoint

    ck, sd, job = tmp_path / "ck", tmp_path / "state", tmp_path / "job"
    for d in (ck, sd, job):
        d.mkdir()
    for step in STEPS:
        val = math.nan if step == NAN_STEP else 2.0 - step / 1000
        save_checkpoint(f.state(step), ck / f"step_{step:06d}.pt", step=step, config={"lr": 3e-4},
                        metrics={"val_loss": {"value": val, "step": step}})
    for p in ck.iterdir():
        f.old_mtime(p)
    toml = tmp_path / "c.toml"
    toml.write_text(f'[job]\ncommand = ["{sys.executable}", "train.py", "--lr", "3e-4"]\nworkdir = "{job}"\n'
                    f'[state]\ndir = "{sd}"\n[checkpoints]\ndir = "{ck}"\n')
    cfg = load_config(str(toml))
    led = Ledger(sd)
    run_id, _ = led.open_run(cfg.job.name, config_json(cfg))
    led.end_run(run_id, "gave_up", 3, "crash")
    led.close()
    return ck, sd, cfg


@pytest.mark.slow
def test_relative_paths_from_elsewhere_give_the_daemons_verdicts_and_nan_is_not_ready(tmp_path):
    ck, sd, cfg = finished_run(tmp_path)
    elsewhere = tmp_path / "a" / "b"  # not the job's workdir, nor at its depth
    elsewhere.mkdir(parents=True)
    cp = subprocess.run([sys.executable, "-m", "supervisor", "checkpoints", "--checkpoint-dir", "../../ck",
                         "--state-dir", "../../state", "--json"], cwd=str(elsewhere), capture_output=True,
                        text=True, timeout=300)
    assert cp.returncode == 0, cp.stderr
    rows = json.loads(cp.stdout)
    got = {r["path"]: (r["ready"], r["reasons"]) for r in rows}
    assert set(got) == {str(ck / f"step_{s:06d}.pt") for s in STEPS}, got  # absolute: where they were typed
    assert "FileNotFoundError" not in cp.stdout + cp.stderr
    assert all(r["load_test"] is not None and r["load_test"]["passed"] for r in rows), rows

    # The daemon's service (the job's command and workdir known, its own load tests) says the same.
    own = sd.with_name("state-daemon")
    shutil.copytree(sd, own, ignore=shutil.ignore_patterns("checkpoint_loadtests.json"))
    svc = CheckpointService(cfg.checkpoints, ck, own, None, list(cfg.job.command), cfg.workdir(),
                            write_manifests=False)
    try:
        assert {str(r.path): (r.ready, list(r.reasons)) for r in svc.quicklist()} == got
        nan_path = str(ck / f"step_{NAN_STEP:06d}.pt")
        ready, reasons = got[nan_path]
        assert ready is False and reasons == ["its recorded val_loss is nan (step 300): not resumed from "
                                              "(restart --from PATH --force takes it anyway)"], reasons
        assert [ready for p, (ready, _) in got.items() if p != nan_path] == [True, True]
        # The daemon's choice passes over it, for a restart as for a rollback, and quarantines nothing.
        for action in ("restart", "rollback"):
            choice = svc.choose_for_resume(action, None)
            assert choice is not None and choice.step == 200, (action, choice)
            assert [Path(p).name for p, _ in choice.skipped] == ["step_000300.pt"], choice.skipped
        assert Path(nan_path).exists() and not (ck / "quarantine").exists()
    finally:
        svc.close()

    # The verdicts saved into the state dir are those passed load tests, under absolute paths.
    stored = json.loads((sd / "checkpoint_loadtests.json").read_text())
    assert len(stored) == len(STEPS)
    assert all(json.loads(k)[0].startswith(str(ck)) and v["passed"] for k, v in stored.items()), stored

    # The report's checkpoint table (no load tests) says not ready, with the same reason.
    rep = subprocess.run([sys.executable, "-m", "supervisor", "report", "--state-dir", "../../state",
                          "--out", "../../report"], cwd=str(elsewhere), capture_output=True, text=True, timeout=120)
    assert rep.returncode == 0, rep.stderr
    page = next((tmp_path / "report").glob("*.html")).read_text()
    assert "its recorded val_loss is nan (step 300): not resumed from" in page


def test_a_nan_eval_beside_a_finite_training_loss_is_a_broken_evaluation_not_unready_weights():
    from supervisor.checkpoints.quicklist import ValMetric, metrics_from_records, nonfinite_metric, val_metric_for
    from supervisor.core.observations import MetricRecord

    nan_val = ValMetric("val_loss", float("nan"), 300)
    # No training loss known, or a non-finite one, or one from before the eval: not ready.
    assert nonfinite_metric(nan_val).startswith("its recorded val_loss is nan (step 300)")
    assert nonfinite_metric(nan_val, ValMetric("loss", float("inf"), 300))
    assert nonfinite_metric(nan_val, ValMetric("loss", 2.1, 250))
    # An empty validation loader: NaN at every eval, the training loss finite at that step: ready.
    seen = metrics_from_records([MetricRecord(step=300, loss=2.1, at=0.0), MetricRecord(step=300, loss=None, val_loss=float("nan"), at=0.0)])
    train = val_metric_for(300, "loss", None, seen)
    assert train is not None and nonfinite_metric(val_metric_for(300, "val_loss", None, seen), train) == ""
