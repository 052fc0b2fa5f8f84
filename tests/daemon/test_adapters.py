"""The checkpoint store (a port: supervisor/daemon/checkpointstore.py) and its plug-in
(checkpointwatch.py), and the health gate and monitors (healthconcern.py), on their own: a real
CheckpointService on real files, the store called as the preparation thread calls it, the plug-in's
reactions as plain calls whose effects are returned (or handed, from its verifier threads)."""
from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any

from supervisor.config.model import Config, config_from_table
from supervisor.core.causes import Action, Cause
from supervisor.core.machine import State
from supervisor.core.messages import EndAttempt, Resume
from supervisor.checkpoints.quicklist import Readiness
from supervisor.daemon.checkpointstore import Booked, CheckpointStorePort, remedy_keys
from supervisor.daemon.checkpointwatch import CheckpointWatch, launch_check
from supervisor.daemon.effects import AttemptField, Detect, Effect, Note
from supervisor.daemon.healthconcern import Backend, HealthMonitors, LaunchGatePort
from supervisor.daemon.plugin import AttemptEnded, AttemptStarted, DaemonStarted, RunView, Tick
from supervisor.eventnames import EventName
from supervisor.events import AttemptContext
from tests.helpers import ckpt_factory as F

from ..fakes import FakeLedger


def run_view(cfg: Config, state_dir: Path, attempt: int = 1) -> RunView:
    return RunView(cfg, "run-1", state_dir, State.RUNNING, attempt, True, None, None,
                   Resume(None, None, "fresh"), None, None, "", 1000.0, 1_700_000_000.0)


def cfg_for(tmp: Path, **checkpoints: Any) -> Config:
    table: dict[str, Any] = {"job": {"command": ["python", "train.py"], "workdir": str(tmp)},
                             "state": {"dir": str(tmp / "state")}}
    if checkpoints:
        table["checkpoints"] = checkpoints
    return config_from_table(table)


class Started:
    """The store and its plug-in as the wiring makes them, the plug-in started; ``handed``: the
    effects its threads put in the runner's inbox."""

    def __init__(self, tmp: Path, **checkpoints: Any) -> None:
        self.cfg = cfg_for(tmp, **checkpoints)
        (tmp / "state").mkdir(exist_ok=True)
        self.run = run_view(self.cfg, tmp / "state")
        self.store = CheckpointStorePort(tmp / "state")
        self.watch = CheckpointWatch(self.store)
        self.handed: list[Effect] = []
        self._lock = threading.Lock()
        self.said = list(self.watch.started(DaemonStarted(FakeLedger(), dict, hand=self._hand), self.run))

    def _hand(self, effect: Effect) -> None:
        with self._lock:
            self.handed.append(effect)

    def choose(self, explicit: str | None = None) -> Resume:
        chosen = self.store.choose(self.cfg, Action.RESTART, None, explicit, [])
        self.said += chosen.notes()
        return chosen.resume

    def attempt(self, attempt: int, resume: Resume, end: EndAttempt | None = None) -> None:
        ctx = AttemptContext("run-1", attempt, 1, 1, 0.0, self.run.state_dir, self.run.state_dir, None,
                             resume.checkpoint, resume.step)
        self.said += self.watch.attempt_started(AttemptStarted(ctx, resume, 0.0, ()), self.run)
        if end is not None:
            self.said += self.watch.attempt_ended(AttemptEnded(end, resume, 0.0), self.run)

    def named(self, name: str) -> list[dict[str, Any]]:
        return [dict(e.data, message=e.message) for e in self.said if isinstance(e, Note) and e.event == name]


def test_without_a_checkpoint_dir_every_resume_is_fresh_and_nothing_is_watched(tmp_path: Path) -> None:
    s = Started(tmp_path)
    assert s.store.svc is None and s.said == []
    assert s.watch.status(s.run) == {}  # no service: nothing to show, and no error
    assert s.store.emergency_checkpoint_probe() is None
    assert s.choose() == Resume(None, None, "no checkpoint dir configured or found")
    assert s.choose("/x/ckpt").checkpoint == "/x/ckpt"  # restart --from wins
    assert s.store.book_last_attempt() == Booked() and s.said == []
    assert s.watch.tick(Tick(1.0), s.run) == [] and s.watch.close() == []


def test_a_version_not_kept_shows_in_status_before_any_good_checkpoint(tmp_path: Path) -> None:
    s = Started(tmp_path, dir=str(tmp_path / "out"))
    assert s.store.svc is not None and "checkpoint_not_kept" not in s.watch.status(s.run)
    s.store.svc.keep_first.report_not_kept(tmp_path / "out" / "ckpt.pt", "no room for a copy: 1 byte left")
    st = s.watch.status(s.run)
    assert "newest_checkpoint" not in st  # none written yet
    assert "no room for a copy" in st["checkpoint_not_kept"] and st["checkpoint_not_kept"].endswith("s ago)")


def test_a_version_not_kept_is_said_at_the_next_tick_and_at_close_not_after_its_load_test(tmp_path: Path) -> None:
    """The verifier thread that reported it may load-test for many seconds; the run can end first."""
    s = Started(tmp_path, dir=str(tmp_path / "out"))
    assert s.store.svc is not None
    s.store.svc.keep_first.report_not_kept(tmp_path / "out" / "ckpt.pt", "no room for a copy: 1 byte left")
    s.said += s.watch.tick(Tick(1.0), s.run)  # no verifier has finished: the main loop's tick says it
    assert [d["reason"] for d in s.named("checkpoint_not_kept")] == ["no room for a copy: 1 byte left"]
    s.store.svc.keep_first.report_not_kept(tmp_path / "out" / "ckpt.pt", "no room for a copy: 2 bytes left")
    s.said += s.watch.close() or ()
    assert len(s.named("checkpoint_not_kept")) == 2  # each once, the last one at close


def test_choose_names_the_newest_ready_checkpoint_and_books_it_in_the_ledger_only(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    for step in (10, 20):
        F.old_mtime(F.torch_file(out / f"step_{step}.pt", step))
    s = Started(tmp_path, dir=str(out), load_test=False, verify="before-launch")
    r = s.choose()
    assert r.checkpoint == str(out / "step_20.pt") and r.step == 20, r
    (chosen,) = s.named("checkpoint_chosen")
    assert chosen["path"] == str(out / "step_20.pt") and chosen["step"] == 20
    assert [e.ledger_only for e in s.said if isinstance(e, Note) and e.event is EventName.CHECKPOINT_CHOSEN] == [True]


def test_the_host_monitor_is_told_the_size_of_the_newest_complete_checkpoint(tmp_path: Path) -> None:
    assert Started(tmp_path).store.newest_bytes() is None  # no checkpoint dir
    out = tmp_path / "out"
    out.mkdir()
    for step in (10, 20):
        F.old_mtime(F.torch_file(out / f"step_{step}.pt", step))
    assert Started(tmp_path, dir=str(out), load_test=False).store.newest_bytes() == (out / "step_20.pt").stat().st_size


def test_a_checkpoint_failed_from_twice_without_a_newer_one_is_marked_bad(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    for step in (10, 20):
        F.old_mtime(F.torch_file(out / f"step_{step}.pt", step))
    s = Started(tmp_path, dir=str(out), load_test=False, verify="before-launch")
    booked: list[Booked] = []
    for attempt in (1, 2):
        resume = s.choose()
        assert resume.checkpoint == str(out / "step_20.pt")
        s.attempt(attempt, resume, EndAttempt(attempt, Cause.CRASH, Action.RESTART, "exit 1", True))
        prep = threading.Thread(target=lambda: booked.append(s.store.book_last_attempt()))  # the preparation thread
        prep.start()
        prep.join()
    assert [b.marked_bad for b in booked] == [(), ((str(out / "step_20.pt"), "crash"),)]
    (note,) = booked[1].notes()
    assert note.event is EventName.CHECKPOINT_MARKED_BAD and note.data == {"path": str(out / "step_20.pt"), "cause": "crash"}
    assert s.choose().checkpoint == str(out / "step_10.pt")


def test_a_choice_to_verify_beside_its_start_is_dropped_when_that_start_never_comes(tmp_path: Path) -> None:
    """verify = "overlap": the choice travels to attempt_started as a message; a spawn that failed
    leaves it unread, and the next start (here from restart --from) must not load-test it."""
    out = tmp_path / "out"
    out.mkdir()
    F.old_mtime(F.torch_file(out / "step_10.pt", 10))
    s = Started(tmp_path, dir=str(out), verify="overlap")
    assert s.choose().checkpoint == str(out / "step_10.pt")
    assert s.store._to_verify.qsize() == 1  # chosen unverified: its load test waits for the start
    explicit = s.choose(str(out / "step_10.pt.other"))  # the spawn failed; --from
    s.attempt(2, explicit)
    assert s.watch._verifier is None and s.store._to_verify.qsize() == 0


def test_an_attempt_that_is_not_counted_books_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    F.old_mtime(F.torch_file(out / "step_10.pt", 10))
    s = Started(tmp_path, dir=str(out), load_test=False, verify="before-launch")
    for attempt in (1, 2, 3):
        resume = s.choose()
        s.said += s.watch.attempt_ended(AttemptEnded(EndAttempt(attempt, Cause.MANUAL, Action.RESTART, "restart verb",
                                                                False), resume, 0.0), s.run)
        assert s.store.book_last_attempt() == Booked()
    assert s.named("checkpoint_marked_bad") == []


def test_the_emergency_probe_turns_true_only_for_a_new_complete_checkpoint(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    F.old_mtime(F.torch_file(out / "step_10.pt", 10))
    s = Started(tmp_path, dir=str(out), load_test=False, verify="before-launch")
    probe = s.store.emergency_checkpoint_probe()
    assert probe is not None and probe() is False
    (out / "step_20.pt.tmp").write_bytes(b"half a save")  # a temp file is not a checkpoint
    assert probe() is False
    F.old_mtime(F.torch_file(out / "step_20.pt", 20))
    assert probe() is True


def test_the_load_test_beside_a_start_becomes_a_note_a_resume_step_or_a_detection(tmp_path: Path) -> None:
    """What the verifier thread hands the runner, as a plain function of the load test's row."""
    path = tmp_path / "ckpt.pt"
    row = Readiness(path, 100, "torch", True, True, None, None, {}, None, None, True, ())
    ok, bad = row, dataclasses.replace(row, ready=False, reasons=("the load test failed: EOF",))
    note, field = launch_check(ok, path, 3, same_version=True, wall=5.0)
    assert isinstance(note, Note) and note.event is EventName.CHECKPOINT_VERIFIED_AFTER_LAUNCH
    assert field == AttemptField(3, resume_step=100)
    # the job saved over the file first: the step read is another version's, the resume step stays unknown
    assert [type(e) for e in launch_check(ok, path, 3, same_version=False, wall=5.0)] == [Note]
    (superseded,) = launch_check(bad, path, 3, same_version=False, wall=5.0)
    assert isinstance(superseded, Note) and superseded.event is EventName.CHECKPOINT_SUPERSEDED_BEFORE_VERIFIED
    (det,) = launch_check(bad, path, 3, same_version=True, wall=5.0)
    assert isinstance(det, Detect) and det.detection.cause is Cause.CHECKPOINT_LOAD_ERROR and det.detection.at == 5.0
    assert "attempt 3" in det.detection.summary and "EOF" in (det.detection.evidence or "")


def test_the_found_dir_is_said_to_get_manifests_once_by_whichever_opens_it(tmp_path: Path) -> None:
    s = Started(tmp_path, dir=str(tmp_path / "out"))
    assert [n.event for n in s.said if isinstance(n, Note)] == [EventName.CHECKPOINT_MANIFESTS_ON]
    assert s.store.adopt(s.cfg).notes() == []  # the same dir: opened already, nothing said
    moved = cfg_for(tmp_path, dir=str(tmp_path / "out2"))
    assert s.store.adopt(moved).notes() == []  # not replace: the service stays on its dir
    [said] = s.store.adopt(moved, replace=True).notes()
    assert said.data == {"path": str(tmp_path / "out2")} and s.store.svc is not None
    assert s.store.svc.dir == tmp_path / "out2"


def test_remedy_keys_name_the_flags_and_env_the_ladders_change(tmp_path: Path) -> None:
    cfg = config_from_table({"job": {"command": ["python", "train.py"]},
                             "on": {"nan": {"remedies": [{"args": ["--lr=1e-4", "plain"], "env": {"SEED": "2"}}]}}})
    assert sorted(remedy_keys(cfg)) == ["SEED", "lr"]


# -- the health gate (a port) and monitors (a plug-in) -----------------------------------------

def health_started(tmp: Path, backend: str) -> tuple[HealthMonitors, LaunchGatePort, RunView, list[Any]]:
    cfg = config_from_table({"job": {"command": ["python", "train.py"], "workdir": str(tmp)},
                             "state": {"dir": str(tmp / "state")}, "gpu": {"backend": backend}})
    (tmp / "state").mkdir(exist_ok=True)
    run = run_view(cfg, tmp / "state")
    gpus = Backend(backend)
    monitors = HealthMonitors(gpus, lambda: 1234)
    said = list(monitors.started(DaemonStarted(FakeLedger(), dict), run))
    return monitors, LaunchGatePort(gpus), run, said


def test_without_gpus_the_gate_passes_on_the_host_checks_and_returns_its_verdict(tmp_path: Path) -> None:
    monitors, gate, run, said = health_started(tmp_path, "none")
    verdict = gate.check(run.cfg, [])
    assert verdict is not None and verdict.passed and verdict.summary().startswith("pre-launch gate passed")
    assert said == [] and [type(m).__name__ for m in monitors.monitors(run)] == ["GpuMonitor", "HostMonitor"]
    assert "host" in monitors.snapshot()
    monitors.close()


def test_gpus_that_cannot_be_seen_are_said_blind_never_healthy(tmp_path: Path) -> None:
    """This machine has no NVIDIA driver: the real NVML backend either fails to start (the plug-in
    says so, the gate is none, and the daemon supervises without GPU checks) or reports blind;
    never a healthy GPU."""
    monitors, gate, run, said = health_started(tmp_path, "nvml")
    if monitors.gpu_mon is None:
        (blind,) = said
        assert isinstance(blind, Note) and blind.event is EventName.GPU_BLIND
        assert "GPU backend unavailable" in blind.message and gate.check(run.cfg, []) is None
        assert monitors.status(run) == {} and monitors.monitors(run) == []
    else:
        gpus = monitors.status(run)["gpus"]  # None: not seen yet; a list: each GPU as the backend sees it
        assert gpus is None or all(g.get("state") != "healthy" for g in gpus), gpus
    monitors.close()


def test_what_the_gpu_monitor_cannot_see_is_said_at_the_next_tick(tmp_path: Path) -> None:
    monitors, _, run, _ = health_started(tmp_path, "none")
    monitors._blind.append("NVML lost the device")  # as the monitor's thread reports it
    [note] = monitors.tick(Tick(1.0), run)
    assert isinstance(note, Note) and note.ledger_only and "NVML lost the device" in note.message
    assert monitors.tick(Tick(2.0), run) == []
    monitors.close()


def test_a_monitor_whose_snapshot_fails_is_reported_not_raised(tmp_path: Path) -> None:
    monitors, _, _, _ = health_started(tmp_path, "none")

    class Broken:
        def snapshot(self) -> dict[str, Any]:
            raise OSError("proc unreadable")

    monitors.host_mon = Broken()  # type: ignore[assignment]  # only its snapshot() is read here
    assert monitors.snapshot()["host"] == {"error": "OSError('proc unreadable')"}
    monitors.close()
