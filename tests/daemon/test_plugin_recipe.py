"""docs/DEVELOPING.md "Adding a plug-in", followed step by step: a plug-in that asks the job for a
checkpoint every ``every`` steps. Step 1, the class: capability bases, reactions that return
effects. Step 3, its reactions as plain calls. Step 4, plugged into the real runner (on fakes): the
job gets its checkpoint signal, status shows the plug-in's field, and the shape check accepts it."""
from __future__ import annotations

import ast
import inspect
import signal
import sys
from pathlib import Path
from typing import Any, Mapping

from supervisor.daemon.effects import Note, RequestCheckpoint
from supervisor.daemon.plugin import AttemptStarted, Effects, GivesStatus, MetricsBatch, OnAttempts, OnMetrics, RunView
from supervisor.eventnames import EventName
from supervisor.levels import Level

from ..fakes import close_all, daemon, step_line
from ..helpers.sigjob import real_job_process
from ..test_plugin_shape import violations
from .test_plugins import batch, started, view

PKG = Path(__file__).resolve().parents[2] / "supervisor"


class CheckpointEvery(OnAttempts, OnMetrics, GivesStatus):
    """Step 1: ask for a checkpoint every ``every`` steps (a job that saves on SIGUSR1)."""

    name = "checkpoint_every"

    def __init__(self, every: int) -> None:
        self.every = every
        self.next_step = every
        self.asked = 0

    def attempt_started(self, n: AttemptStarted, run: RunView) -> Effects:
        start = n.resume.step or 0  # a resumed attempt counts on from where it resumed
        self.next_step = (start // self.every + 1) * self.every
        return ()

    def metrics(self, n: MetricsBatch, run: RunView) -> Effects:
        steps = [r.step for r in n.records if r.step is not None]
        if not run.has_job or not steps or max(steps) < self.next_step:
            return ()
        self.asked += 1
        self.next_step = (max(steps) // self.every + 1) * self.every
        return [Note(EventName.CHECKPOINT_REQUESTED, Level.INFO, f"step {max(steps)}: asking the job for its "
                     f"checkpoint (every {self.every} steps)", {"step": max(steps)}), RequestCheckpoint()]

    def status(self, run: RunView) -> Mapping[str, Any]:
        return {"checkpoints_asked": self.asked}


def test_step_3_its_reactions_are_plain_calls(tmp_path: Path) -> None:
    p, run = CheckpointEvery(10), view(tmp_path)
    assert p.attempt_started(started(resume=view(tmp_path).resume), run) == ()  # resumed at step 100: next 110
    assert p.metrics(batch((105, 2.0, 1.0)), run) == ()
    note, ask = p.metrics(batch((110, 2.0, 1.0)), run)
    assert isinstance(note, Note) and note.event is EventName.CHECKPOINT_REQUESTED and ask == RequestCheckpoint()
    assert p.status(run) == {"checkpoints_asked": 1} and p.metrics(batch((111, 2.0, 1.0)), run) == ()


def test_step_4_through_the_real_runner_the_job_gets_its_signal_and_status_the_field(tmp_path: Path) -> None:
    p = CheckpointEvery(10)
    d = daemon(tmp_path, concerns=[p])
    try:
        _step_4_body(d)
    finally:
        close_all()


def _step_4_body(d: Any) -> None:
    with real_job_process(d.launcher.job):  # a job that handles SIGUSR1 is sent it (issue 34)
        d.lines(*[step_line(s, 2.0) for s in range(1, 10)])
        assert d.launcher.job.signals == []
        d.lines(step_line(10, 2.0))
        d.step(3)  # the request reaches the loop, which signals the job
        assert d.launcher.job.signals.count(signal.SIGUSR1) == 1
        assert d.runner.status()["checkpoints_asked"] == 1
        # The plug-in's note (with its step), then the machine's own line as it signals the job.
        assert [(e["data"] or {}).get("step") for e in d.ledger.named("checkpoint_requested")] == [10, None]


def test_the_shape_check_accepts_the_recipes_plugin() -> None:
    src = inspect.getsource(sys.modules[__name__])
    ast.parse(src)
    assert violations({"supervisor/daemon/checkpointevery.py": src}, (PKG / "daemon" / "ports.py").read_text()) == []
