"""The restart policy as a pure function: scripted histories, no processes."""
from __future__ import annotations

import pytest

from supervisor.config.model import config_from_table
from supervisor.core.causes import CAUSES
from supervisor.events import Action, Cause
from supervisor.core.policy import Failure, PastAttempt, backoff_delay, decide, merge_args


def cfg(**sections):
    return config_from_table({"job": {"command": ["true"]}, **sections})


def past(n, cause=Cause.CRASH, ended_at=1000.0, ran_s=1.0, counted=True):
    return [PastAttempt(i, cause, ended_at + i, ran_s, counted) for i in range(n)]


def test_every_cause_has_a_default_action_and_crash_restarts():
    assert set(CAUSES) == set(Cause)
    d = decide(cfg(), [], Failure(Cause.CRASH, "exit 1"), now=1000, ran_s=5)
    assert d.action is Action.RESTART and d.relaunch
    assert decide(cfg(), [], Failure(Cause.NAN, "nan"), now=1000, ran_s=5).action is Action.ROLLBACK
    assert decide(cfg(), [], Failure(Cause.NO_PROGRESS, "x"), now=1000, ran_s=5).action is Action.GIVE_UP


def test_configured_action_wins_over_default_and_monitor_suggestion():
    c = cfg(on={"gpu_fault": {"action": "restart"}})
    d = decide(c, [], Failure(Cause.GPU_FAULT, "Xid 79", suggested_action=Action.GIVE_UP), now=0, ran_s=1)
    assert d.action is Action.RESTART
    d = decide(cfg(), [], Failure(Cause.GPU_FAULT, "Xid 79", suggested_action=Action.GIVE_UP), now=0, ran_s=1)
    assert d.action is Action.GIVE_UP and "Xid 79" in d.reason


def test_warn_keeps_running():
    d = decide(cfg(on={"loss_spike": {"action": "warn"}}), [], Failure(Cause.LOSS_SPIKE, "spike"), now=0, ran_s=1)
    assert d.action is Action.WARN and not d.relaunch


def test_restart_budget_within_window():
    c = cfg(policy={"max_restarts": 3, "restart_window_s": 100})
    assert decide(c, past(2), Failure(Cause.CRASH, "x"), now=1010, ran_s=1).relaunch
    d = decide(c, past(3), Failure(Cause.CRASH, "x"), now=1010, ran_s=1)
    assert d.action is Action.GIVE_UP and "restart budget spent: 3" in d.reason
    # The same failures long ago are outside the window: budget available again.
    assert decide(c, past(3, ended_at=0), Failure(Cause.CRASH, "x"), now=1000, ran_s=1).relaunch
    # Attempts that were not failures (daemon restarts) do not count.
    assert decide(c, past(3, counted=False), Failure(Cause.CRASH, "x"), now=1010, ran_s=1).relaunch


def test_zero_restarts_gives_up_at_first_failure():
    d = decide(cfg(policy={"max_restarts": 0}), [], Failure(Cause.CRASH, "x"), now=0, ran_s=1)
    assert d.action is Action.GIVE_UP


def test_backoff_schedule_exponential_capped_and_reset_by_healthy_run():
    c = cfg(policy={"backoff_initial_s": 2, "backoff_factor": 3, "backoff_max_s": 50, "backoff_jitter": 0,
                    "max_restarts": 100, "healthy_after_s": 60})
    delays = [decide(c, past(n), Failure(Cause.CRASH, "x"), now=1100, ran_s=1).delay_s for n in range(6)]
    assert delays == [2, 6, 18, 50, 50, 50]
    # A long healthy run resets the count.
    healthy = past(3) + [PastAttempt(3, Cause.CRASH, 1050, 3600)]
    assert decide(c, healthy, Failure(Cause.CRASH, "x"), now=1100, ran_s=1).delay_s == 2  # the failure right after a healthy hour is a first failure
    assert decide(c, past(4), Failure(Cause.CRASH, "x"), now=1100, ran_s=3600).delay_s == 2


def test_backoff_jitter_stays_within_bounds():
    c = cfg(policy={"backoff_initial_s": 10, "backoff_jitter": 0.2})
    assert backoff_delay(c, 1, -1.0) == pytest.approx(8.0)
    assert backoff_delay(c, 1, 1.0) == pytest.approx(12.0)
    assert backoff_delay(c, 1, 5.0) == pytest.approx(12.0)  # draws are clamped
    assert backoff_delay(c, 0, 0.0) == 0.0


def test_remedy_ladder_climbs_cumulatively_then_gives_up():
    c = cfg(policy={"max_restarts": 100}, on={"nan": {"action": "rollback", "remedies": [
        {"env": {"LR_SCALE": "0.5"}}, {"args": ["--lr=1e-4"]}, {"skip_batches": 500}]}})
    f = Failure(Cause.NAN, "loss is nan")
    first = decide(c, [], f, now=2000, ran_s=1)
    assert first.action is Action.ROLLBACK and first.remedies.rungs == ()
    second = decide(c, past(1, Cause.NAN), f, now=2000, ran_s=1)
    assert dict(second.remedies.env) == {"LR_SCALE": "0.5"} and second.remedies.args == ()
    third = decide(c, past(2, Cause.NAN), f, now=2000, ran_s=1)
    assert third.remedies.args == ("--lr=1e-4",) and dict(third.remedies.env) == {"LR_SCALE": "0.5"}
    fourth = decide(c, past(3, Cause.NAN), f, now=2000, ran_s=1)
    assert fourth.remedies.skip_batches == 500 and fourth.remedies.rungs == (0, 1, 2)
    fifth = decide(c, past(4, Cause.NAN), f, now=2000, ran_s=1)
    assert fifth.action is Action.GIVE_UP and "remedies did not help" in fifth.reason
    # A different cause in between breaks the streak.
    mixed = past(3, Cause.NAN) + [PastAttempt(9, Cause.CRASH, 1999, 1)]
    assert decide(c, mixed, f, now=2000, ran_s=1).remedies.rungs == ()


def test_merge_args_replaces_same_key():
    assert merge_args(["train.py", "--lr=1e-3", "--bs", "8"], ["--lr=1e-4", "--fast"]) == [
        "train.py", "--lr=1e-4", "--bs", "8", "--fast"]


def test_restart_at_once_after_progress_backoff_only_for_fast_failures_without_progress():
    c = cfg(policy={"backoff_initial_s": 10, "backoff_factor": 2, "backoff_jitter": 0, "max_restarts": 100,
                    "healthy_after_s": 600})
    crash = Failure(Cause.CRASH, "killed")
    # An attempt that made progress relaunches at once, whatever came before it.
    d = decide(c, past(3), crash, now=1100, ran_s=5, progressed=True)
    assert d.delay_s == 0 and d.delay_reason.startswith("no delay: the attempt made progress")
    # Without progress: backoff, counting only the failures in a row without progress.
    d = decide(c, [], crash, now=1100, ran_s=5)
    assert d.delay_s == 10 and "1 attempt(s) in a row failed without progress" in d.delay_reason
    assert decide(c, past(2), crash, now=1100, ran_s=5).delay_s == 40
    hist = past(2) + [PastAttempt(2, Cause.CRASH, 1050, 5, True, progressed=True)]
    assert decide(c, hist, crash, now=1100, ran_s=5).delay_s == 10  # the progress reset the count
    hist += [PastAttempt(3, Cause.CRASH, 1060, 5, True, progressed=False)]
    assert decide(c, hist, crash, now=1100, ran_s=5).delay_s == 20


def test_no_backoff_for_a_rollback_after_a_nan_or_spike_even_without_progress():
    c = cfg(policy={"backoff_initial_s": 10, "backoff_jitter": 0.5, "max_restarts": 100})
    for cause in (Cause.NAN, Cause.LOSS_SPIKE):
        d = decide(c, past(4, cause), Failure(cause, "x"), now=1100, ran_s=1, jitter_draw=1.0)
        assert d.action is Action.ROLLBACK and d.delay_s == 0
        assert d.delay_reason == f"no delay: rollback after a detected {cause.value}"
    # A NaN configured to restart (not roll back) is not a rollback: the no-progress backoff applies.
    c2 = cfg(policy={"backoff_initial_s": 10, "backoff_jitter": 0}, on={"nan": {"action": "restart"}})
    assert decide(c2, [], Failure(Cause.NAN, "x"), now=1100, ran_s=1).delay_s == 10


def test_an_identical_repeat_gives_up_without_remedies_and_climbs_at_once_with_them():
    from supervisor.core.policy import RepeatKey, same_failure

    key = RepeatKey("out/ckpt.pt", 40, "abc", 44, "")
    assert same_failure(key, RepeatKey("out/ckpt.pt", 40, "abc", 54, ""), 10)
    assert not same_failure(key, RepeatKey("out/ckpt.pt", 40, "abc", 55, ""), 10)
    assert not same_failure(key, RepeatKey("out/ckpt.pt", 60, "abc", 44, ""), 10)  # another version of the file
    assert not same_failure(key, RepeatKey("out/ckpt.pt", 40, "abd", 44, ""), 10)  # another launch
    assert not same_failure(key, None, 10)
    c = cfg(policy={"backoff_initial_s": 10, "backoff_jitter": 0, "max_restarts": 100})
    nan = Failure(Cause.NAN, "loss is nan at step 44", step=44)
    hist = [PastAttempt(0, Cause.NAN, 1000, 5, True, repeat=key)]
    d = decide(c, hist, nan, now=1100, ran_s=5, repeat=key)
    assert d.action is Action.GIVE_UP and "identical to attempt 0" in d.reason and "out/ckpt.pt (step 40)" in d.reason
    # Different: the budget goes on as before.
    assert decide(c, hist, nan, now=1100, ran_s=5, repeat=RepeatKey(None, None, "abc", 44, "")).relaunch
    # With a rung left: it climbs, and at once (a deterministic failure gains nothing from waiting).
    c2 = cfg(policy={"backoff_initial_s": 10, "backoff_jitter": 0}, on={"crash": {"remedies": [{"args": ["--x=1"]}]}})
    crash = Failure(Cause.CRASH, "exit 1", step=44, detail="exit 1")
    ck = RepeatKey("out/ckpt.pt", 40, "abc", 44, "exit 1")
    d = decide(c2, [PastAttempt(0, Cause.CRASH, 1000, 5, True, repeat=ck)], crash, now=1100, ran_s=5, repeat=ck)
    assert d.relaunch and d.remedies.rungs == (0,) and d.delay_s == 0 and "identical repeat" in d.delay_reason
    # A crash by a signal from outside is not deterministic.
    kill = RepeatKey("out/ckpt.pt", 40, "abc", 44, "SIGKILL")
    d = decide(c, [PastAttempt(0, Cause.CRASH, 1000, 5, True, repeat=kill)], Failure(Cause.CRASH, "killed"),
               now=1100, ran_s=5, repeat=kill)
    assert d.relaunch


def test_scale_remedies_multiply_a_flag_already_in_the_argv_in_both_forms_cumulatively():
    from supervisor.core.policy import combine_remedies, scale_args, scaled_value
    from supervisor.core.settings import Remedy

    assert scale_args(["python", "train.py", "--learning_rate=50.0"], {"--learning_rate": 0.5}) == [
        "python", "train.py", "--learning_rate=25.0"]
    assert scale_args(["train.py", "--lr", "3e-4", "--bs", "32"], {"--lr": 0.5, "--bs": 0.5}) == [
        "train.py", "--lr", "0.00015", "--bs", "16"]
    assert scale_args(["train.py"], {"--lr": 0.5}) == ["train.py"]  # absent: untouched
    assert scaled_value("1", 0.5) == "1" and scaled_value("0.001", 0.5) == "0.0005"
    rungs = (Remedy(scale={"--learning_rate": 0.5}), Remedy(scale={"--learning_rate": 0.5}))
    assert dict(combine_remedies(rungs, 2).scale) == {"--learning_rate": 0.25}
    assert combine_remedies(rungs, 1).as_json()[0]["scale"] == {"--learning_rate": 0.5}


def test_scale_remedies_are_checked_against_job_command():
    from supervisor.config.model import ConfigError

    ok = config_from_table({"job": {"command": ["python", "t.py", "--learning_rate", "50.0"]},
                            "on": {"nan": {"remedies": [{"scale": {"--learning_rate": 0.5}}]}}})
    assert ok.remedies_for(Cause.NAN)[0].scale["--learning_rate"] == 0.5
    for command, scale, words in ((["python", "t.py"], {"--learning_rate": 0.5}, "is not in job.command"),
                                  (["python", "t.py", "--lr=x"], {"--lr": 0.5}, "not a number"),
                                  (["python", "t.py", "--lr=1"], {"--lr": 0.0}, "factor > 0")):
        with pytest.raises(ConfigError) as e:
            config_from_table({"job": {"command": command}, "on": {"nan": {"remedies": [{"scale": scale}]}}})
        assert words in str(e.value), str(e.value)


def test_no_backoff_after_a_checkpoint_load_error_the_next_attempt_resumes_from_another():
    c = cfg(policy={"backoff_initial_s": 10})
    d = decide(c, past(2), Failure(Cause.CHECKPOINT_LOAD_ERROR, "load test failed"), now=1100, ran_s=1)
    assert d.relaunch and d.delay_s == 0
    assert d.delay_reason.startswith("no delay: the checkpoint that failed to load is set aside")
    assert decide(c, past(2), Failure(Cause.CRASH, "x"), now=1100, ran_s=1).delay_s == 40  # others still back off
