"""The runner's wiring on fakes (``tests/fakes.py``): real detectors, policy, state machine,
validation and launch spec; fake job, ledger, checkpoints, gate and clock. Detection -> decision
-> stop -> the checkpoint chosen -> the next launch, in milliseconds."""
from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from supervisor.config.model import ConfigSource
from supervisor.core.causes import Action, Cause, GateCheck
from supervisor.core.machine import State
from supervisor.daemon.plugin import Effects, GivesLiveStatus, JobHung, OnAttempts, RunView
from supervisor.errors import Conflict, SupervisorError, UnknownVerb
from supervisor.health.config import GpuConfig
from supervisor.health.gate import run_gate
from supervisor.health.gpufake import FakeBackend
from supervisor.ops.control import ControlError, ControlServer
from supervisor.ops.controlclient import request

from ..fakes import config, daemon, step_line
from ..helpers.sigjob import real_job_process


class HungSpy(OnAttempts):
    name = "spy"

    def __init__(self) -> None:
        self.hung: list[tuple[int, list[int]]] = []

    def job_hung(self, n: JobHung, run: RunView) -> Effects:
        self.hung.append((n.attempt, list(n.pids)))
        return ()


def relaunched_at_once(d: Any) -> bool:
    """The last failure was followed by a relaunch with no backoff (it made progress, or a NaN rollback)."""
    last = d.ledger.named("restart_scheduled")[-1]["data"]
    return last["delay_s"] == 0.0 and last["delay_reason"].startswith("no delay") and d.runner.state in (
        State.STARTING, State.RUNNING)


def backoff_over(d: Any) -> None:
    d.clock.advance(60.0)
    d.settle()


def test_nan_is_rolled_back_to_the_checkpoint_before_its_onset_not_before_the_detection(tmp_path: Path):
    d = daemon(tmp_path, steps=[100, 110, 115])
    first = d.launcher.job
    d.lines(*[step_line(s, 2.0) for s in range(100, 111)])  # finite up to 110, printed every step
    d.lines(step_line(120, "nan"))  # the next line is at 120: the poison began at 111
    assert first.signals == [signal.SIGTERM]
    d.step()
    assert relaunched_at_once(d)
    row = d.ledger.rows[0]
    assert (row["cause"], row["action"]) == ("nan", "rollback") and row["detection"]["onset_step"] == 111
    backoff_over(d)
    assert d.checkpoints.calls[-1] == (Action.ROLLBACK, 111, None)
    env = d.launcher.specs[-1].env
    assert env["TSUP_RESUME_FROM"] == "ckpt/step_110.pt" and env["TSUP_RESUME_STEP"] == "110"
    assert d.runner.attempt == 1 and d.ledger.rows[1]["checkpoint"] == "ckpt/step_110.pt"


def test_a_hang_dumps_stacks_stops_the_job_with_the_hang_grace_and_restarts(tmp_path: Path):
    cfg = config(tmp_path, heartbeat={"timeout_s": 5.0, "dump_stacks": False},
                 shutdown={"grace_s": 120.0, "hang_grace_s": 3.0})
    spy = HungSpy()
    d = daemon(tmp_path, cfg, steps=[50], concerns=[spy])
    d.launcher.ignore = (signal.SIGTERM,)  # the next attempt ignores SIGTERM
    d.lines(*[step_line(s, 2.0) for s in range(1, 20)])
    first = d.launcher.job
    d.clock.advance(6.0)  # silent for longer than the timeout
    d.step(3)
    assert spy.hung == [(0, [first.pid])] and first.signals == [signal.SIGTERM]
    assert relaunched_at_once(d)
    assert d.ledger.rows[0]["cause"] == "hang" and d.ledger.rows[0]["shutdown"]["escalated"] is False
    backoff_over(d)
    assert d.checkpoints.calls[-1][0] is Action.RESTART and d.runner.attempt == 1
    second = d.launcher.job
    d.lines(*[step_line(s, 2.0) for s in range(50, 70)])
    d.clock.advance(6.0)
    d.step(3)
    assert second.signals == [signal.SIGTERM] and d.runner.state is State.STOPPING
    d.clock.advance(3.5)  # past the hang grace (not the 120 s grace): SIGKILL
    d.step(3)
    assert second.signals == [signal.SIGTERM, signal.SIGKILL] and relaunched_at_once(d)
    assert d.ledger.rows[1]["shutdown"]["escalated"] is True


def test_a_failed_validation_rolls_back_further_with_the_diagnostics_env(tmp_path: Path):
    cfg = config(tmp_path, validation={"steps": 5, "diagnostics_env": {"NCCL_DEBUG": "INFO"}})
    d = daemon(tmp_path, cfg, steps=[50, 100])
    d.lines(*[step_line(s, 2.0) for s in range(1, 106)])
    d.lines(step_line(106, "nan"))
    d.step()
    backoff_over(d)
    assert d.launcher.specs[-1].env["TSUP_RESUME_STEP"] == "100"
    assert "NCCL_DEBUG" not in d.launcher.specs[-1].env
    assert "validation_started" in d.events()
    d.lines(*[step_line(s, 9.0) for s in range(101, 106)])  # far above the loss at step 100
    d.step()
    assert "validation_failed" in d.events() and relaunched_at_once(d)
    assert d.ledger.rows[1]["validation_json"]["verdict"] == "fail"
    backoff_over(d)
    assert d.checkpoints.calls[-1] == (Action.ROLLBACK, 100, None)  # the resumed step is the onset
    env = d.launcher.specs[-1].env
    assert env["TSUP_RESUME_STEP"] == "50" and env["NCCL_DEBUG"] == "INFO"
    assert d.ledger.rows[1]["cause"] == "validation_failed"


def test_a_passing_validation_is_recorded_and_the_run_goes_on(tmp_path: Path):
    cfg = config(tmp_path, validation={"steps": 5})
    d = daemon(tmp_path, cfg, steps=[100])
    d.lines(*[step_line(s, 2.0) for s in range(1, 106)])
    d.lines(step_line(106, "nan"))
    d.step()
    backoff_over(d)
    d.lines(*[step_line(s, 2.0) for s in range(101, 106)])
    assert "validation_passed" in d.events() and d.runner.state is State.RUNNING


@pytest.mark.parametrize("broken, cause", [("gpu", "gpu_fault"), ("storage", "disk_low")])
def test_the_gates_typed_verdict_becomes_the_give_up_cause(tmp_path: Path, broken: str, cause: str):
    fake = FakeBackend(2, timeline=[(0, {"lost": {"device": 1}})] if broken == "gpu" else [])
    fake.init()
    ckdir = tmp_path / ("ckpt" if broken == "gpu" else "vanished")
    ckdir.mkdir(exist_ok=broken == "gpu") if broken == "gpu" else None
    verdict = run_gate(fake, GpuConfig(), [], checkpoint_dir=ckdir)
    assert verdict.failed_checks == ((GateCheck.GPU_REPAIR,) if broken == "gpu" else (GateCheck.STORAGE,))
    d = daemon(tmp_path, gate=verdict)
    assert d.runner.exit_code == 3 and d.runner.state is State.GAVE_UP and not d.launcher.specs
    gave_up = d.ledger.named("gave_up")[0]
    assert gave_up["data"]["cause"] == cause and "health gate failed" in gave_up["message"]
    # The port returned its verdict; the loop booked it, before the give-up it led to.
    (booked,) = d.ledger.named("health_gate")
    assert booked["level"] == "error" and booked["data"]["passed"] is False and d.events().index("health_gate") < (
        d.events().index("gave_up"))


def test_crash_restart_then_clean_exit(tmp_path: Path):
    d = daemon(tmp_path, steps=[10])
    d.lines(step_line(12, 2.0))
    d.launcher.job.exits(1)
    d.step(2)
    assert relaunched_at_once(d) and d.ledger.rows[0]["cause"] == "crash"
    assert d.ledger.rows[0]["detection"]["step"] == 12
    backoff_over(d)
    assert d.gate.previous[-1] == [4000], "the gate waits for the previous attempt's pids"
    d.launcher.job.exits(0)
    d.step(2)
    assert d.runner.exit_code == 0 and d.runner.state is State.FINISHED
    assert d.ledger.runs["run-1"]["state"] == "finished"


def test_status_answers_a_restart_at_once_not_at_the_next_refresh(tmp_path: Path):
    """`status` is answered from a cache the loop refreshes every quarter second; a state change
    refreshes it at once (a status read right after the journal's restart line saw no restart)."""
    d = daemon(tmp_path, steps=[10])
    d.runner.refresh_status_cache()  # what the control concern's tick does
    assert d.runner.control("status", {})["restarts_by_cause"] == {}
    d.lines(step_line(12, 2.0))
    d.launcher.job.exits(1)
    d.step(2)  # the clock stands still: no periodic refresh is due
    st = d.runner.control("status", {})
    assert st["restarts_by_cause"] == {"crash": 1} and st["state"] == d.runner.state.value


class LateWarning(GivesLiveStatus):
    """A plug-in whose warning is set by a thread of its own (a checkpoint verifier)."""

    name = "late"

    def __init__(self) -> None:
        self.warning: str | None = None

    def live_status(self) -> dict[str, Any]:
        return {} if self.warning is None else {"late_warning": self.warning}


def test_status_shows_what_another_thread_set_before_the_next_refresh(tmp_path: Path):
    """A warning logged by a verifier thread shows in the next `status`: the cached snapshot is
    read under each concern's live fields (CI saw a "checkpoint not kept" line, then a status
    without it)."""
    late = LateWarning()
    d = daemon(tmp_path, steps=[10], concerns=[late])
    d.runner.refresh_status_cache()
    assert "late_warning" not in d.runner.control("status", {})
    t = threading.Thread(target=lambda: setattr(late, "warning", "no room for a copy"))
    t.start()
    t.join()
    assert d.runner.control("status", {})["late_warning"] == "no room for a copy"  # no refresh ran


def test_status_shows_a_reloaded_limit_at_once(tmp_path: Path):
    d = daemon(tmp_path)
    d.runner.refresh_status_cache()
    toml = tmp_path / "tsup.toml"
    toml.write_text(f'[job]\ncommand = ["python", "train.py"]\nworkdir = "{tmp_path}"\n'
                    f'[state]\ndir = "{tmp_path / "state"}"\n[policy]\nmax_restarts = 7\n')
    d.runner.config_source = ConfigSource.of_file(toml)
    assert control(d, "reload")["reloaded"]
    assert d.runner.control("status", {})["max_restarts"] == 7  # no periodic refresh ran


def test_the_first_metric_moves_the_attempt_to_running(tmp_path: Path):
    d = daemon(tmp_path)
    assert d.runner.state is State.STARTING
    d.lines(step_line(1, 2.0))
    assert d.runner.state is State.RUNNING and d.ledger.metric_rows


def control(d: Any, verb: str, args: dict[str, Any] | None = None) -> Any:
    """Ask the runner from another thread (as the control server does) while the loop steps."""
    out: dict[str, Any] = {}

    def ask() -> None:
        try:
            out["result"] = d.runner.control(verb, args or {}, timeout=5.0)
        except Exception as e:
            out["error"] = e

    t = threading.Thread(target=ask)
    t.start()
    while t.is_alive():
        d.step()
    if "error" in out:
        raise out["error"]
    return out["result"]


def test_control_verbs_reach_the_machine_and_refusals_are_typed(tmp_path: Path):
    d = daemon(tmp_path, steps=[10])
    job = d.launcher.job
    with real_job_process(job):  # a job that handles SIGUSR1 is sent it (issue 34)
        assert control(d, "checkpoint-now") == {"signal": "SIGUSR1", "pgid": job.pgid}
    assert job.signals == [signal.SIGUSR1]
    with pytest.raises(UnknownVerb, match="unknown verb 'dance'"):
        control(d, "dance")
    job.ignore = {signal.SIGTERM}
    assert control(d, "restart", {"reason": "new data", "rollback": True})["accepted"]
    with pytest.raises(Conflict, match="cannot restart while stopping"):
        control(d, "restart", {})
    d.clock.advance(121.0)  # the grace is over: SIGKILL
    d.step(2)
    assert job.signals[-2:] == [signal.SIGTERM, signal.SIGKILL]
    backoff_over(d)
    assert d.checkpoints.calls[-1][0] is Action.ROLLBACK and d.ledger.rows[0]["cause"] == "manual"
    assert d.runner.status()["restarts_by_cause"] == {"manual": 1}
    assert control(d, "stop")["accepted"]
    d.step(2)
    assert d.runner.exit_code == 0 and d.runner.state is State.STOPPED


def test_a_bug_in_a_request_is_an_internal_error_not_a_refusal(tmp_path: Path):
    def handler(verb: str, args: Any) -> Any:
        if verb == "restart":
            raise Conflict("cannot restart while stopping")
        raise KeyError("a bug")

    server = ControlServer(tmp_path, handler)
    server.start()
    try:
        with pytest.raises(ControlError) as refused:
            request(tmp_path, "restart")
        with pytest.raises(ControlError) as bug:
            request(tmp_path, "stop")
    finally:
        server.close()
    assert refused.value.code == "conflict" and bug.value.code == "internal"
    assert issubclass(ControlError, SupervisorError)


def test_detection_to_decision_uses_the_registry_for_warnings(tmp_path: Path):
    d = daemon(tmp_path)
    from supervisor.core.observations import Detection

    d.runner.emit(Detection(Cause.DISK_LOW, "3 GB free", "host", at=time.time()))
    d.step()
    assert "detection_warned" in d.events() and d.runner.state is State.STARTING
