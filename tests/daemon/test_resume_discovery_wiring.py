"""Checkpoint dir and resume discovery, and resume_ignored, through the real runner on fakes
(tests/fakes.py): the concerns as build_daemon wires them, a clock the test moves."""
from __future__ import annotations

import os
import time
from pathlib import Path


from supervisor.core.machine import State
from supervisor.daemon.checkpointstore import CheckpointStorePort
from supervisor.daemon.checkpointwatch import CheckpointWatch
from supervisor.daemon.ckptdiscovery import CheckpointDiscoveryPlugin
from supervisor.daemon.resumewatch import ResumeWatchPlugin
from supervisor.job.launch import heartbeat_dir
from tests.util import wait_for
from tests.helpers import ckpt_factory as F

from ..fakes import config, daemon, step_line




def discovery(tmp: Path) -> list:
    store = CheckpointStorePort(tmp / "state")  # the state dir of fakes.config
    found = CheckpointDiscoveryPlugin(lambda cfg, replace=False: store.adopt(cfg, replace=replace).notes(), store.newest)
    store.takes_checkpoint = found.hands_checkpoint  # as the wiring does
    return [found, CheckpointWatch(store)]


def test_an_hf_script_gets_its_output_dir_and_resume_flag_as_if_configured(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("from transformers import Trainer, TrainingArguments\n")
    cfg = config(tmp_path, job={"command": ["python", "train.py", "--output_dir", "out"]})
    d = daemon(tmp_path, cfg, steps=[10], concerns=discovery(tmp_path))
    assert d.runner.cfg.checkpoint_dir() == tmp_path / "out"
    assert d.launcher.specs[0].env["TSUP_CHECKPOINT_DIR"] == str(tmp_path / "out")  # already the first attempt
    names = d.events()
    assert "checkpoint_dir_found" in names and "resume_inferred" in names
    st = d.runner.status()
    assert st["checkpoint_dir"] == {"path": str(tmp_path / "out"), "found_by": "--output_dir in the command"}
    assert st["resume"]["source"] == "inferred"
    d.lines(step_line(12, 2.0))
    d.launcher.job.exits(1)
    d.step(2)
    d.clock.advance(60.0)
    d.settle()
    argv = d.launcher.specs[-1].argv
    assert argv[-2:] == ("--resume_from_checkpoint", "ckpt/step_10.pt"), argv  # the fake store's path


def test_an_explicit_config_wins_over_what_the_command_says(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("from transformers import TrainingArguments\n")
    cfg = config(tmp_path, job={"command": ["python", "train.py", "--output_dir", "out"],
                                "resume_args": ["--r={checkpoint}"]},
                 checkpoints={"dir": str(tmp_path / "mine")})
    d = daemon(tmp_path, cfg, concerns=discovery(tmp_path))
    assert d.runner.cfg.checkpoint_dir() == tmp_path / "mine" and d.runner.cfg.job.resume_args == ("--r={checkpoint}",)
    assert "checkpoint_dir_found" not in d.events() and "resume_inferred" not in d.events()
    st = d.runner.status()
    assert st["checkpoint_dir"]["found_by"] == "config" and st["resume"]["source"] == "config"


def test_a_dir_appearing_under_the_workdir_is_found_and_unhandable_checkpoints_warned_once(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('a loop that never reads a checkpoint')\n")
    d = daemon(tmp_path, concerns=discovery(tmp_path))
    assert d.runner.cfg.checkpoint_dir() is None and "checkpoint_dir_unknown" in d.events()
    assert d.runner.status()["checkpoint_dir"]["looking_under"] == [str(tmp_path)]
    ck = F.torch_file(tmp_path / "runs" / "ckpts" / "step_7.pt", 7)
    os.utime(ck, (time.time() - 3, time.time() - 3))  # written during the run, settled
    for _ in range(3):
        d.clock.advance(6.0)
        d.step()
    assert d.runner.cfg.checkpoint_dir() == tmp_path / "runs" / "ckpts"
    assert d.runner.status()["checkpoint_dir"]["found_by"].startswith("a checkpoint-shaped entry")
    assert d.events().count("resume_unavailable") == 1
    [warn] = [e for e in d.ledger.events if e["event"] == "resume_unavailable"]
    assert "--resume-arg=--resume={checkpoint}" in warn["message"] and warn["level"] == "warning"
    d.launcher.job.exits(1)
    d.step(2)
    d.clock.advance(60.0)
    d.settle()
    assert d.launcher.specs[-1].env["TSUP_CHECKPOINT_DIR"] == str(tmp_path / "runs" / "ckpts")


def test_a_job_that_starts_over_after_a_resume_is_resume_ignored_and_not_restarted_for_it(tmp_path: Path) -> None:
    d = daemon(tmp_path, config(tmp_path, validation={"steps": 5}), steps=[100], concerns=[ResumeWatchPlugin()])
    d.lines(*[step_line(s, 2.0) for s in range(1, 106)])
    d.lines(step_line(106, "nan"))
    d.step()
    d.clock.advance(60.0)
    d.settle()
    assert d.launcher.specs[-1].env["TSUP_RESUME_STEP"] == "100"
    d.lines(*[step_line(s, 2.5) for s in range(1, 8)])  # started over
    d.step(3)
    names = d.events()
    assert "resume_ignored" in names and "validation_failed" in names
    [ev] = [e for e in d.ledger.events if e["event"] == "resume_ignored"]
    assert ev["level"] == "warning" and ev["data"]["resume_step"] == 100 and ev["data"]["first_step"] == 1
    v = d.ledger.rows[1]["validation_json"]
    assert v["verdict"] == "fail" and v["checks"]["resume"]["passed"] is False and "resume_ignored" in v["summary"]
    assert d.runner.state is State.RUNNING and len(d.launcher.specs) == 2  # kept running, no restart for it
    assert d.runner.status()["resume_ignored"]["first_step"] == 1


def test_a_real_resume_is_not_resume_ignored(tmp_path: Path) -> None:
    d = daemon(tmp_path, config(tmp_path, validation={"steps": 5}), steps=[100], concerns=[ResumeWatchPlugin()])
    d.lines(*[step_line(s, 2.0) for s in range(1, 106)])
    d.lines(step_line(106, "nan"))
    d.step()
    d.clock.advance(60.0)
    d.settle()
    d.lines(*[step_line(s, 2.0) for s in range(101, 108)])
    assert "resume_ignored" not in d.events() and "validation_passed" in d.events()
    assert d.runner.status()["resume_ignored"] is None


def test_a_scanned_dir_follows_the_job_to_the_folder_its_next_attempt_saves_in(tmp_path: Path) -> None:
    # Lightning at its defaults: lightning_logs/version_0/checkpoints, then version_1/ after a resume.
    (tmp_path / "fit.py").write_text("print('a Lightning script')\n")
    concerns = discovery(tmp_path)
    d = daemon(tmp_path, config(tmp_path, job={"command": ["python", "fit.py"]}), steps=[5], concerns=concerns)
    v0, v1 = (tmp_path / "lightning_logs" / f"version_{i}" / "checkpoints" for i in (0, 1))
    os.utime(F.LAYOUT_CASES[F.Layout.LIGHTNING](v0, 5), None)
    d.clock.advance(6.0)

    def found() -> bool:  # the scan runs on its own thread; a later turn takes its result
        d.step()
        return d.runner.cfg.checkpoint_dir() == v0

    wait_for(found, 30, what="the periodic scan finds version_0/checkpoints")
    d.lines(step_line(6, 2.0))
    d.launcher.job.exits(1)
    d.step(2)
    d.clock.advance(60.0)
    d.settle()  # attempt 1 runs; it saves in version_1
    assert d.launcher.specs[-1].env["TSUP_CHECKPOINT_DIR"] == str(v0)
    made = F.LAYOUT_CASES[F.Layout.LIGHTNING](v1, 10)
    os.utime(made, (time.time() + 1, time.time() + 1))
    d.lines(step_line(40, 2.0))  # far from the first crash's step: not one deterministic failure
    d.launcher.job.exits(1)
    d.step(2)
    assert d.runner.cfg.checkpoint_dir() == v1 and concerns[1].store.svc.dir == v1
    assert "checkpoint_dir_moved" in d.events()
    d.clock.advance(60.0)
    d.settle()
    assert d.launcher.specs[-1].env["TSUP_CHECKPOINT_DIR"] == str(v1)


def test_a_client_job_relaunched_is_not_warned_before_its_first_heartbeat(tmp_path: Path) -> None:
    """The demo's false resume_unavailable: its job reads TSUP_RESUME_FROM through the client
    (known by its heartbeats: its module is out of the workdir's sight); the relaunched attempt's
    heartbeat folder is still empty while its imports run, and the checkpoint the first attempt
    wrote is there: that is no job that cannot be handed one."""
    (tmp_path / "train.py").write_text("print('the client is imported by a module the daemon cannot read')\n")
    cfg = config(tmp_path, checkpoints={"dir": str(tmp_path / "ckpt"), "settle_s": 0.5})
    concerns = discovery(tmp_path)
    d = daemon(tmp_path, cfg, steps=[10], concerns=concerns)
    (heartbeat_dir(d.runner.state_dir, 0) / "rank-0.json").write_text("{}")  # the client's heartbeat
    ck = F.torch_file(tmp_path / "ckpt" / "step_10.pt", 10)  # attempt 0's checkpoint, settled
    os.utime(ck, (time.time() - 3, time.time() - 3))
    d.clock.advance(6.0)
    d.step(2)
    d.launcher.job.exits(1)
    d.step(2)
    d.clock.advance(60.0)
    d.settle()
    assert len(d.launcher.specs) == 2 and d.launcher.specs[-1].env["TSUP_ATTEMPT"] == "1"
    assert not any(heartbeat_dir(d.runner.state_dir, 1).iterdir())  # attempt 1 wrote none yet
    wait_for(lambda: concerns[1].store.newest() is not None, 10, 0.1, "the checkpoint seen by the daemon")
    for _ in range(3):
        d.clock.advance(6.0)
        d.step()
    assert "resume_unavailable" not in d.events(), [e["message"] for e in d.ledger.events
                                                    if e["event"] == "resume_unavailable"]


def test_discovery_answers_its_start_with_notes_and_the_config_to_run_on(tmp_path: Path) -> None:
    """As plain calls: the found dir and the inferred flag come back as notes and one UseConfig;
    the store is asked to open its service on the new config (the wiring's adopt)."""
    from supervisor.config.model import Config
    from supervisor.daemon.effects import Note, UseConfig
    from supervisor.daemon.plugin import DaemonStarted
    from supervisor.eventnames import EventName
    from supervisor.levels import Level

    from ..fakes import FakeLedger
    from .test_plugins import view

    (tmp_path / "train.py").write_text("from transformers import Trainer, TrainingArguments\n")
    cfg = config(tmp_path, job={"command": ["python", "train.py", "--output_dir", "out"]})
    adopted: list[tuple[Path | None, bool]] = []
    opened = Note(EventName.CHECKPOINT_MANIFESTS_ON, Level.INFO, "the store's note, returned with the config")

    def adopt(c: Config, replace: bool = False) -> list[Note]:
        adopted.append((c.checkpoint_dir(), replace))
        return [opened]

    p = CheckpointDiscoveryPlugin(adopt)
    said = p.started(DaemonStarted(FakeLedger(), dict), view(tmp_path, cfg=cfg))
    assert [e.event for e in said if isinstance(e, Note)] == ["resume_inferred", "checkpoint_dir_found",
                                                               "checkpoint_manifests_on"]
    [use] = [e for e in said if isinstance(e, UseConfig)]
    assert use.cfg.checkpoint_dir() == tmp_path / "out" and use.cfg.job.resume_args
    assert adopted == [(tmp_path / "out", False)] and p.hands_checkpoint()
    assert p.status(view(tmp_path, cfg=use.cfg))["resume"]["source"] == "inferred"
