"""The checkpoint concern (supervisor/daemon/checkpointconcern.py) and the health concern
(healthconcern.py) on their own: a real CheckpointService on
real files, driven call by call as the runner drives it, with a recording view of the daemon."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Mapping, Sequence

from supervisor.config.model import Config, config_from_table
from supervisor.core.causes import Action, Cause
from supervisor.core.machine import State
from supervisor.core.messages import EndAttempt, Resume
from supervisor.daemon.checkpointconcern import CheckpointConcern, remedy_keys
from supervisor.daemon.effects import AttemptField, Effect, Note
from supervisor.daemon.healthconcern import Backend, HealthMonitors, LaunchGatePort
from supervisor.daemon.plugin import DaemonStarted, RunView, Tick
from supervisor.core.observations import Detection, MetricRecord
from supervisor.eventnames import EventName
from supervisor.job.output import SinkFanout
from tests.helpers import ckpt_factory as F

from ..fakes import FakeClock, FakeLedger


class View:
    """The DaemonView port, recording what the concern tells the daemon."""

    def __init__(self, cfg: Config, state_dir: Path) -> None:
        self.cfg, self.state_dir, self.run_id = cfg, state_dir, "run-1"
        self.history: Any = FakeLedger()
        self.applied: list[AttemptField] = []  # the attempt fields the concern asked to write
        self.clock: Any = FakeClock()
        self.fanout = SinkFanout()
        self.events: list[tuple[str, str, str, dict[str, Any]]] = []
        self.detections: list[Detection] = []
        self._attempt = 1
        self._lock = threading.Lock()

    def run_view(self) -> RunView:
        return RunView(self.cfg, self.run_id, self.state_dir, State.RUNNING, self._attempt, True, None, None,
                       Resume(None, None, "fresh"), None, None, "", self.clock.monotonic(), self.clock.time())

    @property
    def attempt(self) -> int:
        return self._attempt

    @property
    def metric_history(self) -> Sequence[MetricRecord]:
        return []

    def apply(self, effect: Effect) -> None:
        with self._lock:
            if isinstance(effect, AttemptField):
                self.applied.append(effect)
            elif isinstance(effect, Note):
                self.events.append((str(effect.event), str(effect.level), effect.message, dict(effect.data)))
            else:
                raise AssertionError(f"the checkpoint concern applies no {type(effect).__name__}")

    def emit(self, d: Detection) -> None:
        with self._lock:
            self.detections.append(d)

    def on_metric(self, rec: MetricRecord) -> None:
        pass

    def event(self, event: str, level: str, message: str, *, ledger_only: bool = False, **data: Any) -> None:
        with self._lock:
            self.events.append((event, level, message, data))

    def control(self, verb: str, args: Mapping[str, Any], timeout: float = 20.0) -> Any:
        raise AssertionError("the checkpoint concern sends no control requests")

    def request_checkpoint(self) -> None:
        pass

    def refresh_status_cache(self) -> dict[str, Any]:
        return {}

    def use_config(self, cfg: Config) -> None:
        self.cfg = cfg

    def named(self, name: str) -> list[dict[str, Any]]:
        return [dict(data, message=msg) for ev, _lvl, msg, data in self.events if ev == name]


def cfg_for(tmp: Path, **checkpoints: Any) -> Config:
    table: dict[str, Any] = {"job": {"command": ["python", "train.py"], "workdir": str(tmp)},
                             "state": {"dir": str(tmp / "state")}}
    if checkpoints:
        table["checkpoints"] = checkpoints
    return config_from_table(table)


def started(tmp: Path, **checkpoints: Any) -> tuple[CheckpointConcern, View]:
    cfg = cfg_for(tmp, **checkpoints)
    (tmp / "state").mkdir(exist_ok=True)
    view = View(cfg, tmp / "state")
    concern = CheckpointConcern()
    concern.start(view)
    return concern, view


def test_without_a_checkpoint_dir_every_resume_is_fresh_and_nothing_is_watched(tmp_path: Path) -> None:
    concern, view = started(tmp_path)
    assert concern.svc is None
    assert concern.status() == {}  # no service: nothing to show, and no error
    assert concern.emergency_checkpoint_probe() is None
    r = concern.choose(view.cfg, Action.RESTART, None, None, [])
    assert r == Resume(None, None, "no checkpoint dir configured or found")
    assert concern.choose(view.cfg, Action.RESTART, None, "/x/ckpt", []).checkpoint == "/x/ckpt"  # restart --from wins
    assert concern.book_last_attempt() is None and view.events == []


def test_a_version_not_kept_shows_in_status_before_any_good_checkpoint(tmp_path: Path) -> None:
    concern, _ = started(tmp_path, dir=str(tmp_path / "out"))
    assert concern.svc is not None and "checkpoint_not_kept" not in concern.status()
    concern.svc.keep_first.report_not_kept(tmp_path / "out" / "ckpt.pt", "no room for a copy: 1 byte left")
    st = concern.status()
    assert "newest_checkpoint" not in st  # none written yet
    assert "no room for a copy" in st["checkpoint_not_kept"] and st["checkpoint_not_kept"].endswith("s ago)")


def test_a_version_not_kept_is_booked_at_the_next_tick_and_at_close_not_after_its_load_test(tmp_path: Path) -> None:
    """The verifier thread that reported it may load-test for many seconds; the run can end first."""
    concern, view = started(tmp_path, dir=str(tmp_path / "out"))
    assert concern.svc is not None
    concern.svc.keep_first.report_not_kept(tmp_path / "out" / "ckpt.pt", "no room for a copy: 1 byte left")
    concern.tick(0.0)  # no verifier has finished: the main loop books it
    assert [d["reason"] for d in view.named("checkpoint_not_kept")] == ["no room for a copy: 1 byte left"]
    concern.svc.keep_first.report_not_kept(tmp_path / "out" / "ckpt.pt", "no room for a copy: 2 bytes left")
    concern.close()
    assert len(view.named("checkpoint_not_kept")) == 2  # each once, the last one at close


def test_choose_names_the_newest_ready_checkpoint_and_books_it_in_the_ledger_only(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    for step in (10, 20):
        F.old_mtime(F.torch_file(out / f"step_{step}.pt", step))
    concern, view = started(tmp_path, dir=str(out), load_test=False, verify="before-launch")
    r = concern.choose(view.cfg, Action.RESTART, None, None, [])
    assert r.checkpoint == str(out / "step_20.pt") and r.step == 20, r
    (chosen,) = view.named("checkpoint_chosen")
    assert chosen["path"] == str(out / "step_20.pt") and chosen["step"] == 20


def test_the_host_monitor_is_told_the_size_of_the_newest_complete_checkpoint(tmp_path: Path) -> None:
    assert started(tmp_path)[0].newest_bytes() is None  # no checkpoint dir
    out = tmp_path / "out"
    out.mkdir()
    for step in (10, 20):
        F.old_mtime(F.torch_file(out / f"step_{step}.pt", step))
    concern, _ = started(tmp_path, dir=str(out), load_test=False)
    assert concern.newest_bytes() == (out / "step_20.pt").stat().st_size


def test_a_checkpoint_failed_from_twice_without_a_newer_one_is_marked_bad(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    for step in (10, 20):
        F.old_mtime(F.torch_file(out / f"step_{step}.pt", step))
    concern, view = started(tmp_path, dir=str(out), load_test=False, verify="before-launch")
    for attempt in (1, 2):
        resume = concern.choose(view.cfg, Action.RESTART, None, None, [])
        assert resume.checkpoint == str(out / "step_20.pt")
        concern.attempt_started(type("Ctx", (), {"attempt": attempt})(), resume, 0.0)
        concern.attempt_ended(EndAttempt(attempt, Cause.CRASH, Action.RESTART, "exit 1", True), resume, 0.0)
        prep = threading.Thread(target=concern.book_last_attempt)  # the preparation thread, before the next choice
        prep.start()
        prep.join()
    bad = view.named("checkpoint_marked_bad")
    assert [b["path"] for b in bad] == [str(out / "step_20.pt")] and bad[0]["cause"] == "crash"
    assert concern.choose(view.cfg, Action.RESTART, None, None, []).checkpoint == str(out / "step_10.pt")


def test_a_choice_to_verify_beside_its_start_is_dropped_when_that_start_never_comes(tmp_path: Path) -> None:
    """verify = "overlap": the choice travels to attempt_started as a message; a spawn that failed
    leaves it unread, and the next start (here from restart --from) must not load-test it."""
    out = tmp_path / "out"
    out.mkdir()
    F.old_mtime(F.torch_file(out / "step_10.pt", 10))
    concern, view = started(tmp_path, dir=str(out), verify="overlap")
    assert concern.choose(view.cfg, Action.RESTART, None, None, []).checkpoint == str(out / "step_10.pt")
    assert concern._to_verify.qsize() == 1  # chosen unverified: its load test waits for the start
    explicit = concern.choose(view.cfg, Action.RESTART, None, str(out / "step_10.pt.other"), [])  # the spawn failed; --from
    concern.attempt_started(type("Ctx", (), {"attempt": 2})(), explicit, 0.0)
    assert concern._verifier is None and concern._to_verify.qsize() == 0


def test_an_attempt_that_is_not_counted_books_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    F.old_mtime(F.torch_file(out / "step_10.pt", 10))
    concern, view = started(tmp_path, dir=str(out), load_test=False, verify="before-launch")
    for attempt in (1, 2, 3):
        resume = concern.choose(view.cfg, Action.RESTART, None, None, [])
        concern.attempt_ended(EndAttempt(attempt, Cause.MANUAL, Action.RESTART, "restart verb", False), resume, 0.0)
        assert concern.book_last_attempt() is None
    assert view.named("checkpoint_marked_bad") == []


def test_the_emergency_probe_turns_true_only_for_a_new_complete_checkpoint(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    F.old_mtime(F.torch_file(out / "step_10.pt", 10))
    concern, _ = started(tmp_path, dir=str(out), load_test=False, verify="before-launch")
    probe = concern.emergency_checkpoint_probe()
    assert probe is not None and probe() is False
    (out / "step_20.pt.tmp").write_bytes(b"half a save")  # a temp file is not a checkpoint
    assert probe() is False
    F.old_mtime(F.torch_file(out / "step_20.pt", 20))
    assert probe() is True


def test_remedy_keys_name_the_flags_and_env_the_ladders_change(tmp_path: Path) -> None:
    cfg = config_from_table({"job": {"command": ["python", "train.py"]},
                             "on": {"nan": {"remedies": [{"args": ["--lr=1e-4", "plain"], "env": {"SEED": "2"}}]}}})
    assert sorted(remedy_keys(cfg)) == ["SEED", "lr"]


# -- the health gate (a port) and monitors (a plug-in) -----------------------------------------

def health_started(tmp: Path, backend: str) -> tuple[HealthMonitors, LaunchGatePort, RunView, list[Any]]:
    cfg = config_from_table({"job": {"command": ["python", "train.py"], "workdir": str(tmp)},
                             "state": {"dir": str(tmp / "state")}, "gpu": {"backend": backend}})
    (tmp / "state").mkdir(exist_ok=True)
    run = View(cfg, tmp / "state").run_view()
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
