"""Each plug-in's reactions as pure functions (supervisor/daemon/plugin.py): a notice and a frozen
RunView in, effects out; no runner, no thread, no clock but the view's. What the runner then does
with the effects is tested once, in tests/daemon/test_effects.py and the wiring tests."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from supervisor.core.causes import Action, Cause
from supervisor.core.machine import State
from supervisor.core.messages import EndAttempt, Resume
from supervisor.core.observations import MetricRecord
from supervisor.daemon.effects import AttemptField, Detect, Note, RequestCheckpoint
from supervisor.daemon.plugin import (AttemptEnded, AttemptStarted, DaemonStarted, MetricsBatch, OnMetrics, RunView,
                                      Tick, reaction)
from supervisor.daemon.precursors import PrecursorPlugin
from supervisor.daemon.progress import GoodputPlugin, ValidationPlugin
from supervisor.daemon.resumewatch import ResumeWatchPlugin
from supervisor.eventnames import EventName
from supervisor.levels import Level
from supervisor.events import AttemptContext

from ..fakes import FakeLedger, config

FRESH = Resume(None, None, "fresh start")
RESUMED = Resume("ckpt/step_100.pt", 100, "newest verified")


def view(tmp: Path, **changes: Any) -> RunView:
    cfg = changes.pop("cfg", None) or config(tmp)
    base = RunView(cfg, "run-1", tmp / "state", State.RUNNING, 1, True, None, None, RESUMED, None, None, "",
                   now=1000.0, wall=1_700_000_000.0)
    return dataclasses.replace(base, **changes)


def started(attempt: int = 1, resume: Resume = RESUMED, history: tuple[MetricRecord, ...] = (),
            wall: float = 1_700_000_000.0) -> AttemptStarted:
    ctx = AttemptContext("run-1", attempt, 4000, 4000, 1000.0, Path("/s"), Path("/s/hb"), None, resume.checkpoint,
                         resume.step)
    return AttemptStarted(ctx, resume, wall, history)


def batch(*steps: tuple[int, float, float], now: float = 1001.0) -> MetricsBatch:
    return MetricsBatch([MetricRecord(step=s, loss=loss, grad_norm=g, at=1_700_000_000.0 + s)
                         for s, loss, g in steps], now)


def names(effects: Any) -> list[Any]:
    return [e.event if isinstance(e, Note) else type(e).__name__ for e in effects]


def test_the_precursor_asks_for_one_checkpoint_when_the_grad_norm_ramps_and_none_without_a_job(tmp_path: Path):
    cfg = config(tmp_path, detectors={"precursor": {"warmup_steps": 20, "min_points": 10}})
    run, p = view(tmp_path, cfg=cfg), PrecursorPlugin()
    assert p.attempt_started(started(resume=FRESH), run) == ()
    calm = batch(*[(s, 2.0 - 0.001 * s, 1.0 + 0.01 * (s % 7)) for s in range(1, 61)])
    assert p.metrics(calm, run) == [] and p.status(run) == {"precursor_checkpoints": 0}
    ramp = batch(*[(61 + k, 1.9, 2.0 ** (k + 1)) for k in range(8)])
    assert p.metrics(ramp, dataclasses.replace(run, has_job=False)) == ()  # nothing to ask: no job
    effects = p.metrics(ramp, run)
    assert names(effects) == [EventName.DIVERGENCE_PRECURSOR, "RequestCheckpoint"]
    note = effects[0]
    assert isinstance(note, Note) and note.level is Level.WARNING and note.data["kind"] == "grad_norm_ramp"
    assert effects[1] == RequestCheckpoint() and p.status(run) == {"precursor_checkpoints": 1}


def test_the_resume_watch_says_an_ignored_checkpoint_once_and_keeps_it_for_status(tmp_path: Path):
    run, p = view(tmp_path), ResumeWatchPlugin()
    p.attempt_started(started(resume=RESUMED), run)
    [note] = p.metrics(batch((1, 2.5, 1.0)), run)  # the job started over from step 1
    assert isinstance(note, Note) and note.event is EventName.RESUME_IGNORED and "resume-arg" in note.message
    assert p.metrics(batch((2, 2.4, 1.0)), run) == ()  # judged once, on the first step
    assert p.status(run)["resume_ignored"]["attempt"] == 1
    p.attempt_started(started(2, resume=RESUMED), run)
    assert p.metrics(batch((101, 2.0, 1.0)), run) == ()  # resumed as handed: nothing to say


def test_a_checkpoint_not_handed_to_the_job_is_never_blamed(tmp_path: Path):
    run, p = view(tmp_path), ResumeWatchPlugin()
    p.attempt_started(started(resume=dataclasses.replace(RESUMED, handed=False)), run)
    assert p.metrics(batch((1, 2.5, 1.0)), run) == ()


def test_goodput_rebuilds_its_tracks_from_the_ledger_and_follows_each_attempt(tmp_path: Path):
    led = FakeLedger()
    led.begin_attempt("run-1", 0, ["python"], "/", {}, None, None, None, [], None)
    tracks: dict[int, Any] = {}
    g, run = GoodputPlugin(tracks), view(tmp_path, run_id="run-1", attempt=1)
    assert g.started(DaemonStarted(led, dict), run) == () and list(tracks) == [0]  # the dict handed in is the one kept
    g.attempt_started(started(1, wall=run.wall - 100.0), run)
    g.metrics(batch((101, 2.0, 1.0), (102, 1.9, 1.0)), run)
    assert tracks[1].startup() == pytest.approx(101 + 100.0)  # launch -> the first step's record
    g.attempt_ended(AttemptEnded(EndAttempt(1, Cause.CRASH, Action.RESTART, "exit 1", True), RESUMED, run.wall), run)
    assert tracks[1].cause == "crash" and "goodput" in g.status(run)


def test_validation_says_it_starts_then_fails_with_a_field_a_note_and_a_detection(tmp_path: Path):
    cfg = config(tmp_path, validation={"steps": 5})
    run = view(tmp_path, cfg=cfg)
    history = tuple(MetricRecord(step=s, loss=2.0, grad_norm=1.0, at=float(s)) for s in range(80, 101))
    v = ValidationPlugin({})
    assert v.attempt_started(started(resume=FRESH), run) == ()  # a fresh start: nothing to validate
    [note] = v.attempt_started(started(resume=RESUMED, history=history), run)
    assert isinstance(note, Note) and note.event is EventName.VALIDATION_STARTED and note.data["reference_loss"] == 2.0
    effects = v.metrics(batch(*[(s, 9.0, 1.0) for s in range(101, 110)]), run)  # the loss jumped after the resume
    assert names(effects) == ["AttemptField", EventName.VALIDATION_FAILED, "Detect"]
    field, detect = effects[0], effects[2]
    assert isinstance(field, AttemptField) and field.attempt == 1 and field.validation is not None
    assert isinstance(detect, Detect) and detect.detection.cause is Cause.VALIDATION_FAILED
    assert detect.detection.at == run.wall and detect.detection.onset_step == 100  # the view's clock, no other
    assert v.status(run)["validation"]["passed"] is False


def test_validation_cut_short_by_the_attempts_end_is_written_incomplete(tmp_path: Path):
    run, v = view(tmp_path), ValidationPlugin({})
    v.attempt_started(started(resume=RESUMED), run)
    assert v.tick(Tick(1001.0), run) == ()  # within the first step's timeout
    end = EndAttempt(1, Cause.CRASH, Action.RESTART, "exit 1", True)
    [field] = v.attempt_ended(AttemptEnded(end, RESUMED, run.wall), run)
    assert isinstance(field, AttemptField) and field.validation is not None
    assert field.validation["verdict"] == "incomplete" and v.attempt_ended(AttemptEnded(end, RESUMED, run.wall), run) == ()


def test_a_plugin_reacts_only_to_the_notices_of_its_capabilities(tmp_path: Path):
    class Counts(OnMetrics):
        def metrics(self, n: MetricsBatch, run: RunView) -> list[Note]:
            return [Note(EventName.METRICS_SEEN, Level.INFO, f"{len(n.records)} records")]

    c, run = Counts(), view(tmp_path)
    assert reaction(c, Tick(1.0)) is None and reaction(c, started()) is None
    react = reaction(c, batch((1, 2.0, 1.0)))
    assert react is not None and names(react(run)) == [EventName.METRICS_SEEN]


def test_the_live_page_says_where_it_listens_or_why_it_cannot(tmp_path: Path):
    import socket

    from supervisor.daemon.webconcern import LivePagePlugin

    (tmp_path / "state").mkdir()
    page = LivePagePlugin()
    run = view(tmp_path, cfg=config(tmp_path, web={"listen": "127.0.0.1:0"}))
    try:
        [note] = page.started(DaemonStarted(FakeLedger(), lambda: {"state": "running"}), run)
        assert isinstance(note, Note)
        assert note.event is EventName.WEB_LISTENING and note.data["port"] > 0 and page.page is not None
    finally:
        page.close()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = view(tmp_path, cfg=config(tmp_path, web={"listen": f"127.0.0.1:{taken.getsockname()[1]}"}))
        [note] = LivePagePlugin().started(DaemonStarted(FakeLedger(), dict), busy)
    assert isinstance(note, Note)
    assert note.event is EventName.WEB_UNAVAILABLE and note.level is Level.ERROR and "supervising without it" in note.message


def test_notify_sends_the_chosen_events_and_says_a_restart_loop_from_the_notices_alone(tmp_path: Path):
    """[notify] as a plug-in: each recorded event is a Noted notice (any thread, no view); the
    chosen ones go to the hook, and three restarts within the window are one restart_loop."""
    import sys

    from supervisor.daemon.alerting import NotifyPlugin
    from supervisor.daemon.plugin import Noted
    from tests.util import wait_for

    out = tmp_path / "sent"
    hook = [sys.executable, "-c", f"import sys; open({str(out)!r}, 'a').write(sys.stdin.read() + '\\n')"]
    cfg = config(tmp_path, notify={"command": hook, "events": ["gave_up", "restart_loop"]})
    p = NotifyPlugin()
    assert p.started(DaemonStarted(FakeLedger(), dict), view(tmp_path, cfg=cfg)) == ()
    try:
        def noted(event: str, now: float) -> Noted:
            return Noted(event, Level.WARNING, f"{event} said", {}, "run-1", 1, 1_700_000_000.0 + now, now)

        assert p.noted(noted("restart_scheduled", 0.0)) == () and p.noted(noted("job_started", 1.0)) == ()
        p.noted(noted("restart_scheduled", 2.0))
        p.noted(noted("restart_scheduled", 3.0))  # the third within the window
        p.noted(noted("gave_up", 4.0))
        wait_for(lambda: out.exists() and out.read_text().count("\n") >= 2, 20, 0.05, "two alerts through the hook")
        sent = out.read_text()
        assert "restart_loop" in sent and "gave_up" in sent and "job_started" not in sent
    finally:
        p.close()
