"""docs/DEVELOPING.md "Adding an action", followed to the letter: a stand-in "wait until cleared"
action (stop the job, spend no restart budget, relaunch once the condition that stopped it has
cleared) is one registry entry and one handler, defined here and nowhere in the package. The real
config, policy and state machine run it (scripted events, the clock in the events); status, the
metrics and the CLI's status show it with no edit of theirs."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from supervisor.cli.render import render_status
from supervisor.config.model import ConfigError, config_from_table
from supervisor.core.causes import (ACTIONS, Action, ActionSpec, Cause, Hold, action_named, forget_action,
                                    new_action, register_action)
from supervisor.core.machine import MOVES, Machine, State
from supervisor.core.messages import (ArmTimer, Boot, ConditionCleared, Detected, EndAttempt, ExitInfo, FirstMetric,
                                      Launch, Mode, PrepareLaunch, Prepared, Record, Reply, RestartRequested, Resume,
                                      ShutdownResult, Spawned, StopFinished, StopJob, StopRequested, TimerFired, Finish)
from supervisor.daemon.status import status_dict
from supervisor.core.observations import Detection
from supervisor.ops.metrics import Metrics

W0 = 1_700_000_000.0  # wall clock of the script


# ---------------------------------------------------------------- the recipe: one entry, one handler
class WaitUntilCleared:
    """The handler: hold the relaunch until the failure's own condition clears."""

    def hold(self, cause: Cause) -> Hold | None:
        return Hold(cause, f"{cause.value} clears")


@pytest.fixture
def wait_action() -> Iterator[Action]:
    action = new_action("wait_until_cleared")
    try:
        register_action(ActionSpec(action, "stop the job; relaunch once the condition cleared, not counted",
                                   ends_attempt=True, relaunches=True, counted=False, handler=WaitUntilCleared()))
        yield action
    finally:
        forget_action(action)


# ---------------------------------------------------------------- driving the real machine
class Run:
    """One machine, its clock advanced by the script, every command kept."""

    def __init__(self, tmp: Path, **sections: Any) -> None:
        table: dict[str, Any] = {"job": {"command": ["python", "train.py"]},
                                 "policy": {"max_restarts": 1, "restart_window_s": 86400.0,
                                            "backoff_initial_s": 5.0, "backoff_jitter": 0.0},
                                 "shutdown": {"mode": "hybrid"},
                                 "on": {"disk_low": {"action": "wait_until_cleared"}}}
        table.update(sections)
        self.cfg = config_from_table(table)
        self.m = Machine(self.cfg, tmp)
        self.now = 100.0

    def __call__(self, ev: Any) -> list[Any]:
        return self.m.handle(ev)

    def launched(self, out: list[Any]) -> list[Any]:
        """PrepareLaunch out -> Prepared -> Spawned -> first metric."""
        assert of(out, PrepareLaunch), out
        out = self(Prepared(resume=Resume("/c/step_100", 100, "newest ready")))
        assert any(isinstance(c, Launch) for c in out)
        out += self(Spawned(10, 10, ["python", "train.py"], self.now))
        out += self(FirstMetric())
        assert self.m.state is State.RUNNING
        return out

    def fail(self, cause: Cause, step: int = 120) -> list[Any]:
        """A detection of ``cause``, then the job's stop finishes."""
        self.now += 30
        d = Detection(cause, f"{cause.value} seen", "disk", step=step, at=W0 + self.now)
        out = self(Detected(d, self.now, W0 + self.now))
        assert self.m.state is State.STOPPING and any(isinstance(c, StopJob) for c in out)
        self.now += 1
        info = ExitInfo(None, "SIGTERM", Cause.CRASH, "killed by SIGTERM")
        return out + self(StopFinished(info, ShutdownResult(Mode.GRACEFUL, False, None, 1.0, False), self.now,
                                       W0 + self.now))

    def status(self) -> dict[str, Any]:
        return status_dict(self.m, run_id="r1", cfg=self.cfg, state_dir=Path("/state"), pids=[], last_metric=None,
                           restart_in_s=None, extras=[])


def of(out: list[Any], kind: type) -> list[Any]:
    return [c for c in out if isinstance(c, kind)]


def record(out: list[Any], event: str) -> Record:
    found = [c for c in of(out, Record) if c.event == event]
    assert len(found) == 1, (event, [c.event for c in of(out, Record)])
    return found[0]


def test_the_stand_in_stops_the_job_waits_until_cleared_and_relaunches_without_spending_the_budget(
        wait_action: Action, tmp_path: Path) -> None:
    run = Run(tmp_path)
    assert run.cfg.action_for(Cause.DISK_LOW) is wait_action  # the config takes it like a built-in one
    run.launched(run(Boot()))
    # max_restarts = 1, spent by an OOM: a counted action would give up from now on; the waits never do.
    out = run.fail(Cause.OOM)
    assert "restart 1/1" in record(out, "failure_detected").message and run.m.state is State.BACKOFF
    run.launched(run(TimerFired()))
    for n in range(3):
        out = run.fail(Cause.DISK_LOW)
        said = record(out, "failure_detected")
        assert said.data["action"] == "wait_until_cleared" and "waiting until disk_low clears" in said.message
        assert "not counted against the restart budget" in said.message  # the policy's rule, read from the spec
        assert of(out, StopJob)[0].plan.mode is Mode.HYBRID  # its spec's emergency_checkpoint, read by the plan
        end = of(out, EndAttempt)[0]
        assert end.action is wait_action and end.counted is False and end.cause is Cause.DISK_LOW
        # The wait: no timer, no launch, a state of its own; only its condition's clearing ends it.
        assert not of(out, ArmTimer) and not of(out, PrepareLaunch)
        assert run.m.state is State.HELD and run.m.hold == Hold(Cause.DISK_LOW, "disk_low clears")
        assert "not counted against the restart budget" in record(out, "relaunch_held").message
        assert run(TimerFired()) == [] and run(ConditionCleared(Cause.NAN, "loss finite")) == []
        assert run.m.state is State.HELD and run.m.counted_restarts == 1
        # The relaunch, once it cleared, from the checkpoint its spec chooses (not before the onset).
        run.now += 600
        out = run(ConditionCleared(Cause.DISK_LOW, "40 GB free"))
        assert "40 GB free" in record(out, "relaunch_released").message
        assert of(out, PrepareLaunch)[0].action is wait_action and run.m.state is State.PREPARING
        assert run.m.attempt == n + 2
        out = run.launched(out)
        assert "restarts so far 1/1" in record(out, "job_started").message
    # The waits spent nothing: the next counted failure finds the OOM's one restart in the window.
    out = run.fail(Cause.OOM, step=5000)  # not an identical repeat of the first OOM
    assert run.m.state is State.GAVE_UP
    assert "restart budget spent: 1 restarts" in record(out, "failure_detected").message


def test_status_metrics_and_the_cli_show_the_wait_with_no_edit_of_theirs(wait_action: Action, tmp_path: Path) -> None:
    run = Run(tmp_path)
    run.launched(run(Boot()))
    run.fail(Cause.DISK_LOW)
    st = run.status()
    assert st["state"] == "held" and "pids" in st and st["pids"] == []
    metrics = Metrics()
    metrics.update(st)
    text = metrics.render().decode()
    assert ',state="held"} 1.0' in text and ',state="backoff"} 0.0' in text  # tsup_state{name="...",state=...}
    assert "held" in render_status(st)
    assert State.HELD in MOVES[State.STOPPING] and MOVES[State.HELD] == {State.PREPARING, State.STOPPED}


def test_an_operator_can_stop_or_restart_a_held_run(wait_action: Action, tmp_path: Path) -> None:
    run = Run(tmp_path)
    run.launched(run(Boot()))
    run.fail(Cause.DISK_LOW)
    out = run(RestartRequested("the disk was cleaned", None, False, W0))
    assert "was waiting until disk_low clears" in of(out, Reply)[0].result["message"]
    assert run.m.state is State.PREPARING and run.m.hold is None
    run.launched(out)
    run.fail(Cause.DISK_LOW)
    out = run(StopRequested())
    assert of(out, Finish)[0].state == "stopped" and run.m.state is State.STOPPED


def test_an_action_is_parsed_by_name_and_an_unknown_one_is_refused_naming_the_known_ones(tmp_path: Path) -> None:
    assert action_named("rollback") is Action.ROLLBACK
    with pytest.raises(ValueError, match="unknown action 'wait_until_cleared' .*known: restart, rollback"):
        action_named("wait_until_cleared")
    with pytest.raises(ConfigError, match="wait_until_cleared"):
        Run(tmp_path)
    added = new_action("wait_until_cleared")
    try:
        with pytest.raises(ValueError, match="exists already"):
            new_action("wait_until_cleared")
        with pytest.raises(ValueError, match="unknown action"):  # named, but without a spec yet
            action_named("wait_until_cleared")
        with pytest.raises(ValueError, match="built-in"):
            forget_action(Action.RESTART)
    finally:
        forget_action(added)
    assert set(ACTIONS) == set(Action)
