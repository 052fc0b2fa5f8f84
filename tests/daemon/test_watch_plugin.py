"""The watch plug-in (supervisor/daemon/watchconcern.py) as plain calls: a notice and a RunView in,
effects out; the job's lines fed by the test's own thread, as the output readers feed them. The
readers' detections and records go out through ``DaemonStarted.hand`` / ``keep``, never into the
daemon; what the watchers say on the loop is returned from the next reaction."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from supervisor.core.causes import Cause
from supervisor.core.machine import State
from supervisor.core.messages import Resume
from supervisor.core.observations import MetricRecord
from supervisor.core.runend import EndFacts
from supervisor.daemon.effects import Detect, Effect, Note
from supervisor.daemon.plugin import AttemptSpawning, DaemonStarted, JobHung, RunView, Tick, reaction
from supervisor.daemon.watchconcern import WatchPlugin
from supervisor.eventnames import EventName

from ..fakes import FakeClock, config

FRESH = Resume(None, None, "fresh start")


def view(tmp: Path, **changes: object) -> RunView:
    base = RunView(config(tmp), "run-1", tmp / "state", State.RUNNING, 0, True, None, None, FRESH, None, None, "",
                   now=1000.0, wall=1_700_000_000.0)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def line(step: int, loss: float) -> str:
    return json.dumps({"step": step, "loss": loss})


def started(tmp: Path) -> tuple[WatchPlugin, RunView, list[Effect], list[MetricRecord]]:
    handed: list[Effect] = []
    kept: list[MetricRecord] = []
    p, run = WatchPlugin(FakeClock()), view(tmp)
    assert p.started(DaemonStarted(None, dict, hand=handed.append, keep=kept.append), run) == ()  # type: ignore[arg-type]
    return p, run, handed, kept


def test_the_readers_detection_is_handed_over_and_a_nan_warning_comes_back_from_the_tick(tmp_path: Path):
    p, run, handed, kept = started(tmp_path)
    p.lines.feed("stdout", [line(1, 2.0)])  # before the watchers exist: held, handed over in order
    assert p.attempt_spawning(AttemptSpawning(0, FRESH), run) == ()
    assert [m.name for m in p.monitors(run)] == ["heartbeat", "metric_files"]
    p.lines.feed("stdout", [line(2, 1.9), "Warning: loss became NaN at some point, ignoring", line(3, float("nan"))])
    assert [r.step for r in kept] == [1, 2, 3]
    [effect] = handed
    assert isinstance(effect, Detect) and effect.detection.cause is Cause.NAN and effect.detection.step == 3
    [note] = p.tick(Tick(1001.0), run)  # the prose line: a warning on the loop, never a stop
    assert isinstance(note, Note) and note.event == EventName.NAN_MENTIONED and note.data["step"] == 2
    assert p.tick(Tick(1002.0), run) == []
    st = p.status(run)
    assert st["metric_sources"] and "metrics_blind" in st and "hang_timeout" in st


def test_the_end_names_the_sources_seen_on_the_views_terms(tmp_path: Path):
    p, run, _, _ = started(tmp_path)
    assert p.end_facts(EndFacts(), lambda: True, run) == EndFacts()  # no watcher yet: nothing seen
    p.monitors(run)
    p.lines.feed("stdout", [line(s, 2.0) for s in (1, 2, 3)])
    facts = p.end_facts(EndFacts(), lambda: True, run)
    [seen] = facts.sources
    assert (seen.source, seen.records, seen.last_step) == ("stdout", 3, 3)


def test_a_hung_job_without_stack_dumps_is_stopped_with_nothing_said(tmp_path: Path):
    p, run, _, _ = started(tmp_path)
    p.monitors(run)
    off = view(tmp_path, cfg=config(tmp_path, heartbeat={"dump_stacks": False}))
    hung = JobHung(0, [4000])
    react = reaction(p, hung)
    assert react is not None and react(off) == ()
    assert p.job_hung(JobHung(0, []), run) == ()  # no process to dump
