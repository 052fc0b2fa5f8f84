"""The state machine alone: scripted events in, commands out; no process, thread, socket or clock."""
from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from supervisor.config.model import config_from_table
from supervisor.core.causes import CAUSES, Action, Cause, GateCheck, StopStyle
from supervisor.core.machine import MOVES, Machine, State
from supervisor.core.messages import (ArmTimer, Argv, Boot, CheckEnd, CheckpointRequested, Detected, EndAttempt,
                                      EndChecked, EscalateStop, ExitInfo, Finish, FirstMetric, JobExited, Launch, Mode, PrepareLaunch,
                                      Prepared, Record, RecordDetection, Reply, RestartRequested, Resume,
                                      ShutdownResult, SignalJob, Spawned, SpawnFailed, StopFinished, StopJob,
                                      StopRequested, TimerFired)
from supervisor.errors import Conflict, GiveUp
from supervisor.core.observations import Detection
from supervisor.health.gate import GateVerdict
from supervisor.core.policy import PastAttempt
from supervisor.core.runend import EndFacts, SourceSeen, WeightsCheck

T0 = 100.0  # monotonic
W0 = 1_700_000_000.0  # wall


def cfg(**sections: Any):
    table: dict[str, Any] = {"job": {"command": ["python", "train.py"]},
                             "policy": {"backoff_initial_s": 2.0, "backoff_jitter": 0.0}}
    for k, v in sections.items():
        table[k] = {**table.get(k, {}), **v}
    return config_from_table(table)


def of(cmds: list, kind: type) -> list:
    return [c for c in cmds if isinstance(c, kind)]


def one(cmds: list, kind: type) -> Any:
    found = of(cmds, kind)
    assert len(found) == 1, f"expected one {kind.__name__} in {cmds}"
    return found[0]


def records(cmds: list) -> list[str]:
    return [c.event for c in of(cmds, Record)]


class Script:
    """Drives one machine through scripted events, keeping every command it returned."""

    def __init__(self, **sections: Any) -> None:
        self.m = Machine(cfg(**sections), Path("/state"))
        self.now = T0
        self.log: list = []

    def __call__(self, ev: Any) -> list:
        out = self.m.handle(ev)
        self.log += out
        return out

    def running(self, resume: Resume = Resume(None, None, "fresh start"), pid: int = 10) -> list:
        """Boot (or backoff over) -> prepared -> spawned -> first metric."""
        out = self(Boot()) if self.m.attempt < 0 else self(TimerFired())
        assert isinstance(out[-1], PrepareLaunch)
        out += self(Prepared(resume=resume))
        out += self(Spawned(pid, pid, ["python", "train.py"], self.now))
        out += self(FirstMetric())
        assert self.m.state is State.RUNNING
        return out

    def detect(self, cause: Cause, step: int | None = None, onset: int | None = None, **kw: Any) -> list:
        self.now += 30
        d = Detection(cause, f"{cause.value} seen", "stdout", step=step, onset_step=onset, at=W0, **kw)
        return self(Detected(d, self.now, W0 + self.now))

    def stopped(self, code: int | None = None, sig: str | None = "SIGTERM", escalated: bool = False) -> list:
        self.now += 1
        info = ExitInfo(code, sig, Cause.CRASH, f"killed by {sig}")
        return self(StopFinished(info, ShutdownResult(Mode.GRACEFUL, escalated, None, 1.0, False), self.now,
                                 W0 + self.now))

    def exited(self, code: int, group_alive: bool = False, last_step: int = 50, sig: str | None = None) -> list:
        self.now += 30
        info = ExitInfo(code, sig, None if code == 0 else Cause.CRASH, f"exit {code}" if code else "exited 0")
        return self(JobExited(info, group_alive, self.now, W0 + self.now, last_step=last_step))


def test_the_table_of_moves_covers_every_state_and_ends_are_final():
    assert set(MOVES) == set(State)
    for end in (State.STOPPED, State.GAVE_UP, State.FINISHED):
        assert MOVES[end] == frozenset()
    assert State.PREPARING in MOVES[State.BACKOFF] and State.RUNNING not in MOVES[State.BACKOFF]
    # A launch's steps are states of their own: no job before STARTING, no metric before it either.
    assert MOVES[State.PREPARING] == {State.LAUNCHING, State.STOPPED, State.GAVE_UP}
    assert MOVES[State.LAUNCHING] == {State.STARTING, State.STOPPED, State.GAVE_UP}


def test_boot_prepares_the_first_launch_and_launches_what_was_prepared():
    s = Script()
    out = s(Boot(next_attempt=3))
    assert out[-1] == PrepareLaunch(3, Action.RESTART, None, None) and s.m.state is State.PREPARING
    with pytest.raises(Conflict, match="cannot restart while preparing .a launch is being prepared"):
        s(RestartRequested("too early", None, False, W0))
    out = s(Prepared(resume=Resume("ckpt/a.pt", 40, "newest")))
    launch = one(out, Launch)
    assert s.m.state is State.LAUNCHING and s(FirstMetric()) == []  # no job yet: nothing to run
    with pytest.raises(Conflict, match="no running job"):
        s(CheckpointRequested())
    assert (launch.attempt, launch.resume.checkpoint, launch.diagnostics) == (3, "ckpt/a.pt", False)
    out = s(Spawned(7, 7, ["python"], T0))
    assert "job_started" in records(out) and s.m.state is State.STARTING
    s(FirstMetric())
    assert s.m.state is State.RUNNING


def test_nan_stops_the_job_then_rolls_back_to_before_the_onset_step_not_the_detection_step():
    s = Script()
    s.running()
    out = s.detect(Cause.NAN, step=120, onset=111)
    assert one(out, RecordDetection).detection.step == 120
    stop = one(out, StopJob)
    assert stop.plan.mode is Mode.GRACEFUL and not stop.dump_stacks and s.m.state is State.STOPPING
    assert "failure_detected" in records(out)
    out = s.stopped()
    end = one(out, EndAttempt)
    assert (end.cause, end.action, end.counted) == (Cause.NAN, Action.ROLLBACK, True)
    assert one(out, ArmTimer).delay_s == 0.0 and s.m.state is State.BACKOFF  # no backoff for a NaN rollback
    assert "restart_scheduled" in records(out)
    prep = one(s(TimerFired()), PrepareLaunch)
    assert (prep.attempt, prep.action, prep.onset_step) == (1, Action.ROLLBACK, 111)


def test_without_an_onset_the_detection_step_is_the_rollback_bound():
    s = Script()
    s.running()
    s.detect(Cause.LOSS_SPIKE, step=300)
    s.stopped()
    assert one(s(TimerFired()), PrepareLaunch).onset_step == 300


def test_a_hang_dumps_stacks_and_stops_gracefully_with_the_short_hang_grace_whatever_the_mode():
    s = Script(shutdown={"mode": "hybrid", "grace_s": 120.0, "hang_grace_s": 7.0})
    s.running()
    stop = one(s.detect(Cause.HANG), StopJob)
    assert stop.dump_stacks and stop.plan.mode is Mode.GRACEFUL and stop.plan.grace_s == 7.0
    assert stop.plan.reason == "hang" and CAUSES[Cause.HANG].stop is StopStyle.HUNG
    out = s.stopped()
    assert one(out, EndAttempt).cause is Cause.HANG and s.m.state is State.BACKOFF
    assert one(s(TimerFired()), PrepareLaunch).action is Action.RESTART


def test_hybrid_asks_for_an_emergency_checkpoint_on_restart_but_not_on_rollback():
    s = Script(shutdown={"mode": "hybrid"})
    s.running()
    assert one(s.detect(Cause.NCCL_TIMEOUT), StopJob).plan.mode is Mode.HYBRID
    s.stopped()
    s.running()
    assert one(s.detect(Cause.NAN, step=5), StopJob).plan.mode is Mode.GRACEFUL


def test_a_failed_validation_rolls_back_and_the_next_attempts_get_the_diagnostics():
    s = Script()
    s.running(Resume("ckpt/step_100.pt", 100, "newest"))
    s.detect(Cause.VALIDATION_FAILED, step=120, onset=100)
    s.stopped()
    prep = one(s(TimerFired()), PrepareLaunch)
    assert (prep.action, prep.onset_step) == (Action.ROLLBACK, 100)
    assert one(s(Prepared(resume=Resume("ckpt/step_50.pt", 50, "older"))), Launch).diagnostics
    assert CAUSES[Cause.VALIDATION_FAILED].diagnostics


@pytest.mark.parametrize("checks, cause", [
    ((GateCheck.STORAGE,), Cause.DISK_LOW),
    ((GateCheck.GPU_MEMORY, GateCheck.STORAGE), Cause.GPU_FAULT),
    ((GateCheck.GPU_REPAIR,), Cause.GPU_FAULT),
])
def test_a_failed_gate_gives_up_with_the_cause_of_its_first_failed_check(checks, cause):
    s = Script()
    s(Boot())
    verdict = GateVerdict(False, tuple(f"{c} failed" for c in checks), 0.0, failed_checks=checks)
    out = s(Prepared(gate=verdict))
    assert s.m.state is State.GAVE_UP and one(out, Finish).code == 3
    gave_up = [c for c in out if isinstance(c, Record) and c.event == "gave_up"][0]
    assert gave_up.data["cause"] == cause.value and "health gate failed" in gave_up.message
    assert not of(out, Launch)


def test_no_progress_and_a_failed_checkpoint_choice_give_up_with_their_causes():
    s = Script()
    s(Boot())
    out = s(Prepared(no_progress="no progress: 3 attempts"))
    assert [c.data["cause"] for c in of(out, Record) if c.event == "gave_up"] == ["no_progress"]
    s = Script()
    s(Boot())
    out = s(Prepared(error=OSError("disk gone")))
    assert "checkpoint_selection_failed" in records(out)
    assert [c.data["cause"] for c in of(out, Record) if c.event == "gave_up"] == ["checkpoint_load_error"]
    s = Script()
    s(Boot())
    out = s(Prepared(error=GiveUp("node n2 gave up after nan", Cause.NODE_LOST)))  # typed: no checkpoint failure
    assert "checkpoint_selection_failed" not in records(out)
    (gave_up,) = [c for c in of(out, Record) if c.event == "gave_up"]
    assert gave_up.data["cause"] == "node_lost" and "node n2 gave up" in gave_up.message


def test_an_unstartable_job_closes_its_attempt_and_gives_up():
    s = Script()
    s(Boot())
    s(Prepared(resume=Resume(None, None, "fresh")))
    out = s(SpawnFailed(FileNotFoundError(2, "no such file"), ["nope"], "/tmp"))
    end = one(out, EndAttempt)
    assert not end.spawned and end.action is Action.GIVE_UP and s.m.state is State.GAVE_UP
    gave_up = [c for c in out if isinstance(c, Record) and c.event == "gave_up"][0]
    assert gave_up.data["argv"] == Argv(("nope",)) and "cannot start the job" in gave_up.message  # shown by the sink


WATCHED = EndFacts(sources=(SourceSeen("stdout", ("kv",), 12, 40, W0 + T0 + 20),),  # 10 s before the exit
                   weights=WeightsCheck("/ck/step_40.pt", True))


def test_a_clean_exit_finishes_and_leftovers_are_stopped_first():
    s = Script()
    s.running()
    out = s.exited(0)
    ask = one(out, CheckEnd)  # the end's facts first: nothing is said finished before them
    assert not of(out, Finish) and ask.attempt == 0
    out = s(EndChecked(WATCHED, ask))
    assert one(out, Finish).state == "finished" and one(out, Finish).code == 0
    s = Script()
    s.running()
    out = s.exited(0, group_alive=True)
    stop = one(out, StopJob)
    assert stop.leftovers and "job_leftovers" in records(out) and s.m.state is State.STOPPING
    ask = one(s.stopped(code=0, sig=None), CheckEnd)  # the leader's exit 0 counts
    assert one(s(EndChecked(WATCHED, ask)), Finish).state == "finished"


def test_the_end_says_what_was_watched_and_unwatched_or_nan_weights_are_not_called_a_success():
    s = Script()
    s.running()
    ask = one(s.exited(0), CheckEnd)
    out = s(EndChecked(WATCHED, ask))
    exiting = [c for c in of(out, Record) if c.event == "daemon_exiting"][0]
    assert exiting.message.startswith("finished: the job exited 0") and "stdout (kv, 12 records)" in exiting.message
    assert "last step 40, 10.0 s before the end" in exiting.message and "weights finite" in exiting.message
    assert s.m.end is not None and s.m.end["verdict"] == "watched" and s.m.end["last_step"] == 40
    # Nothing seen, no checkpoint: "finished, unwatched", exit 0 as the job's; no claim of a check.
    s = Script()
    s.running()
    ask = one(s.exited(0), CheckEnd)
    out = s(EndChecked(EndFacts(), ask))
    fin = one(out, Finish)
    assert fin.code == 0 and fin.state == "finished" and fin.reason.startswith("finished, unwatched: ")
    assert "weights not checked: no checkpoint dir known" in fin.reason and "finite:" not in fin.reason
    assert records(out)[:1] == ["run_unwatched"] and s.m.end["verdict"] == "unwatched"
    # NaN weights at the end: said as such, and a give-up (exit 3: a human must look).
    s = Script()
    s.running()
    ask = one(s.exited(0), CheckEnd)
    nan = WeightsCheck("/ck/step_40.pt", False, ("0.weight", "0.bias", "2.weight"))
    out = s(EndChecked(EndFacts(weights=nan), ask))
    fin = one(out, Finish)
    assert fin.code == 3 and fin.state == "gave_up" and s.m.state is State.GAVE_UP
    assert fin.reason.startswith("finished with non-finite weights in /ck/step_40.pt: 3 tensor(s) hold NaN/Inf")
    assert "finished, unwatched" in fin.reason
    assert ["run_unwatched", "checkpoint_nonfinite_at_end", "gave_up"] == [
        e for e in records(out) if e in ("run_unwatched", "checkpoint_nonfinite_at_end", "gave_up")]
    assert s.m.end["verdict"] == "nonfinite_weights" and s.m.end["weights"]["nonfinite"][0] == "0.weight"


def test_crashes_restart_until_the_budget_is_spent():
    s = Script(policy={"max_restarts": 2})
    for n in range(2):
        s.running(pid=10 + n)
        out = s.exited(1, last_step=50 + 100 * n)  # different steps: not one deterministic failure
        assert one(out, EndAttempt).cause is Cause.CRASH and s.m.state is State.BACKOFF
    s.running(pid=20)
    out = s.exited(1, last_step=300)
    assert s.m.state is State.GAVE_UP and "restart budget spent" in one(out, Finish).reason
    assert s.m.restarts_by_cause["crash"] == 2  # the restarts; the attempt given up on is none


def test_a_crash_whose_action_is_warn_gives_up_because_the_job_is_gone():
    s = Script(on={"crash": {"action": "warn"}})
    s.running()
    s.exited(1)
    assert s.m.state is State.GAVE_UP and "nothing left to supervise" in s.m.exit_reason


def test_a_warning_cause_records_and_the_job_keeps_running():
    s = Script()
    s.running()
    out = s.detect(Cause.GPU_MEMORY)
    assert records(out) == ["detection_warned"] and not of(out, StopJob) and s.m.state is State.RUNNING


def test_a_detection_during_a_stop_is_only_noted():
    s = Script()
    s.running()
    s.detect(Cause.NAN, step=10)
    out = s.detect(Cause.CRASH)
    assert records(out) == ["detection_noted"] and not of(out, StopJob)


def test_sigterm_stops_gracefully_a_second_escalates_and_the_daemon_exits_143():
    s = Script()
    s.running()
    out = s(StopRequested(signal="SIGTERM"))
    assert records(out)[:2] == ["signal_received", "stop_requested"] and one(out, StopJob)
    assert one(s(StopRequested(signal="SIGTERM")), EscalateStop) == EscalateStop()
    fin = one(s.stopped(escalated=True), Finish)
    # A scheduler's SIGTERM (Slurm time limit, pod eviction) before the job finished is no success.
    assert (fin.state, fin.code) == ("stopped", 143) and "escalated to SIGKILL" in fin.reason


def test_the_stop_verb_exits_zero_and_sigint_130():
    s = Script()
    s.running()
    s(StopRequested())
    assert one(s.stopped(), Finish).code == 0
    s = Script()
    s.running()
    s.exited(1)  # waiting to restart
    assert one(s(StopRequested(signal="SIGINT")), Finish).code == 130


def test_stop_while_waiting_to_restart_or_while_preparing_exits_at_once():
    s = Script()
    s.running()
    s.exited(1)
    assert one(s(StopRequested()), Finish).state == "stopped"
    s = Script()
    s(Boot())
    out = s(StopRequested())
    assert one(out, Finish).state == "stopped" and s.m.state is State.STOPPED
    assert s(Prepared(resume=Resume(None, None, "late"))) == []  # a late preparation is dropped
    s = Script()
    s(Boot())
    s(Prepared(resume=Resume(None, None, "fresh")))
    assert one(s(StopRequested()), Finish).state == "stopped"  # while launching, too


def test_an_operator_restart_is_not_counted_and_can_name_a_checkpoint():
    s = Script()
    s.running()
    out = s(RestartRequested("new data", "ckpt/x.pt", False, W0))
    assert one(out, Reply).result["accepted"] and one(out, StopJob).plan.reason == "manual"
    out = s.stopped()
    end = one(out, EndAttempt)
    assert end.cause is Cause.MANUAL and not end.counted and not s.m.history[-1].counted
    assert one(s(TimerFired()), PrepareLaunch).explicit_checkpoint == "ckpt/x.pt"
    assert s.m.counted_restarts == 0


def test_an_operator_restart_during_backoff_cuts_the_wait_and_one_while_stopping_conflicts():
    s = Script()
    s.running()
    s.exited(1)
    out = s(RestartRequested("now", None, True, W0))
    assert one(out, ArmTimer).delay_s == 0.0 and "backoff" in one(out, Reply).result["message"]
    assert one(s(TimerFired()), PrepareLaunch).action is Action.ROLLBACK
    s = Script()
    s.running()
    s.detect(Cause.NAN, step=3)
    with pytest.raises(Conflict, match="cannot restart while stopping"):
        s(RestartRequested("x", None, False, W0))


def test_checkpoint_now_signals_a_running_job_and_conflicts_without_one():
    s = Script()
    s(Boot())
    with pytest.raises(Conflict, match="no running job"):
        s(CheckpointRequested())
    s(Prepared(resume=Resume(None, None, "fresh")))
    s(Spawned(42, 42, ["python"], T0))
    out = s(CheckpointRequested())
    assert one(out, SignalJob).signal == signal.SIGUSR1 and one(out, Reply).result == {"signal": "SIGUSR1",
                                                                                       "pgid": 42}


def test_repeats_climb_the_remedy_ladder_into_the_next_launch():
    s = Script(on={"nan": {"remedies": [{"env": {"LR_SCALE": "0.5"}}, {"args": ["--lr=1e-4"]}]}},
               policy={"healthy_after_s": 600.0})
    s.running()
    s.detect(Cause.NAN, step=10)
    s.stopped()
    s.running()
    s.detect(Cause.NAN, step=20)
    out = s.stopped()
    assert "remedies_applied" in records(out)
    s(TimerFired())
    launch = one(s(Prepared(resume=Resume(None, None, "fresh"))), Launch)
    assert dict(launch.remedy_env) == {"LR_SCALE": "0.5"}


def test_the_remedies_in_force_are_one_value_from_the_ladders_to_the_launch_and_status() -> None:
    """Two causes' ladders merge into one frozen RemediesInForce: the launch gets all of it (the
    scale too) and status reads the same value (as_status, with the scale)."""
    s = Script(job={"command": ["python", "train.py", "--lr=0.001"]}, policy={"healthy_after_s": 600.0},
               on={"nan": {"remedies": [{"env": {"LR_SCALE": "0.5"}, "scale": {"--lr": 0.5}}]},
                   "oom": {"remedies": [{"args": ["--batch=8"], "skip_batches": 100}]}})
    for cause, step in ((Cause.NAN, 10), (Cause.NAN, 20), (Cause.OOM, 30), (Cause.OOM, 40)):
        s.running()
        s.detect(cause, step=step)
        s.stopped()
    s(TimerFired())
    launch = one(s(Prepared(resume=Resume(None, None, "fresh"))), Launch)
    assert (dict(launch.remedy_env), list(launch.remedy_args), launch.skip_batches, dict(launch.remedy_scale)) == (
        {"LR_SCALE": "0.5"}, ["--batch=8"], 100, {"--lr": 0.5})
    assert s.m.remedies.as_status() == {"env": {"LR_SCALE": "0.5"}, "args": ["--batch=8"], "skip_batches": 100,
                                        "scale": {"--lr": 0.5}}
    with pytest.raises(AttributeError):  # frozen: only the machine replaces it, with plus()
        s.m.remedies.skip_batches = 0  # type: ignore[misc]


def test_history_from_a_previous_daemon_life_counts_against_the_budget():
    s = Script(policy={"max_restarts": 1})
    s(Boot(next_attempt=5, history=[PastAttempt(4, Cause.OOM, W0, 3.0, True)]))
    assert s.m.restarts_by_cause["oom"] == 1 and s.m.attempt == 5
    s(Prepared(resume=Resume(None, None, "fresh")))
    s(Spawned(1, 1, ["python"], T0))
    s.exited(1)
    assert s.m.state is State.GAVE_UP


def test_the_machine_reads_no_clock_every_time_comes_from_the_events():
    s = Script()
    s.running()
    out = s.exited(1)
    d = one(out, EndAttempt).detection
    assert d is not None and d.at == W0 + s.now and s.m.history[-1].ended_at == W0 + s.now


def test_relaunch_at_once_after_progress_backoff_when_no_step_past_the_resume_step():
    s = Script(policy={"backoff_initial_s": 10, "backoff_jitter": 0})
    s.running(Resume("ckpt/step_40.pt", 40, "newest"))
    out = s.exited(1)  # last step 50 > 40: progress
    assert one(out, ArmTimer).delay_s == 0.0
    sched = [r for r in out if isinstance(r, Record) and r.event == "restart_scheduled"][0]
    assert sched.data["delay_reason"].startswith("no delay: the attempt made progress")
    assert "no delay" in sched.message and s.m.history[-1].progressed
    s.running(Resume("ckpt/step_50.pt", 50, "newest"))
    out = s.exited(1)  # died again at step 50: nothing past the resume step, so backoff
    assert one(out, ArmTimer).delay_s == 10.0 and not s.m.history[-1].progressed
    assert "without progress" in [r for r in out if isinstance(r, Record) and r.event == "restart_scheduled"][0].message
    # No metric at all (died during start-up): no progress either.
    out = s(TimerFired())
    s(Prepared(resume=Resume("ckpt/step_50.pt", 50, "newest")))
    s(Spawned(11, 11, ["python", "train.py"], s.now))
    s.now += 1
    out = s(JobExited(ExitInfo(1, None, Cause.CRASH, "exit 1"), False, s.now, W0 + s.now))
    assert one(out, ArmTimer).delay_s == 20.0


def test_an_identical_second_failure_gives_up_at_once_naming_step_checkpoint_evidence_and_what_to_try():
    s = Script(policy={"backoff_initial_s": 10, "backoff_jitter": 0})
    s.running()
    s.detect(Cause.NAN, step=44)
    s.stopped()
    assert s.m.state is State.BACKOFF  # the first NaN: rolled back (from scratch, no checkpoint)
    s.running()
    s.detect(Cause.NAN, step=45)  # within the tolerance, same start, same argv and env
    out = s.stopped()
    assert s.m.state is State.GAVE_UP and one(out, Finish).code == 3
    reason = one(out, Finish).reason
    for part in ("nan at step 45 again", "identical to attempt 0 (step 44)", "starting from scratch",
                 "no remedy is configured in [on.nan]", "Evidence: nan seen", "Try: lower the learning rate"):
        assert part in reason, (part, reason)


def test_not_identical_when_the_step_the_checkpoint_or_the_remedies_differ_or_a_signal_came_from_outside():
    # A different step: the budget, not the repeat rule.
    s = Script()
    s.running()
    s.detect(Cause.NAN, step=44)
    s.stopped()
    s.running()
    s.detect(Cause.NAN, step=200)
    s.stopped()
    assert s.m.state is State.BACKOFF
    # A different checkpoint: not the same start.
    s = Script()
    s.running(Resume("ckpt/step_40.pt", 40, "newest"))
    s.exited(1, last_step=45)
    s.running(Resume("ckpt/step_60.pt", 60, "newest"))
    s.exited(1, last_step=45)
    assert s.m.state is State.BACKOFF
    # A SIGKILL from outside twice at the same place says nothing about the next attempt.
    s = Script()
    s.running(Resume("ckpt/step_40.pt", 40, "newest"))
    s.exited(1, last_step=45, sig="SIGKILL")
    s.running(Resume("ckpt/step_40.pt", 40, "newest"))
    s.exited(1, last_step=45, sig="SIGKILL")
    assert s.m.state is State.BACKOFF
    # A remedy rung changes the launch: the second NaN climbs, the third (all rungs applied) gives up.
    s = Script(on={"nan": {"remedies": [{"env": {"LR_SCALE": "0.5"}}]}})
    s.running()
    s.detect(Cause.NAN, step=44)
    s.stopped()
    s.running()
    s.detect(Cause.NAN, step=44)
    out = s.stopped()
    assert s.m.state is State.BACKOFF and "remedies_applied" in records(out)
    s.running()
    s.detect(Cause.NAN, step=44)
    s.stopped()
    assert s.m.state is State.GAVE_UP
