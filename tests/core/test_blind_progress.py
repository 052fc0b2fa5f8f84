"""The progress rule of a blind attempt (no step parsed): work shown by its output or its files."""
from __future__ import annotations

from pathlib import Path

from supervisor.core import attempts
from supervisor.core.causes import Cause
from supervisor.core.machine import Machine, State
from supervisor.core.messages import (Activity, ArmTimer, Boot, EndAttempt, ExitInfo, JobExited, PrepareLaunch,
                                      Prepared, Record, Resume, Spawned)
from tests.core.test_machine import T0, W0, cfg

FRESH = Resume(None, None, "fresh start")


def test_showed_work_counts_distinct_seconds_of_output_past_the_startup_or_a_file_change():
    steady = Activity(300, tuple(range(0, 64)), None)  # a line every second for a minute
    assert attempts.showed_work(steady, after_s=30, active_s=5)
    assert not attempts.showed_work(steady, after_s=70, active_s=5)  # all of it start-up
    # Start-up chatter, a long silent load, then a traceback within two seconds: no work shown.
    crash = Activity(40, (0, 1, 2, 95, 96), None)
    assert not attempts.showed_work(crash, after_s=60, active_s=5)
    # A checkpoint saved past the start-up is work, whatever was printed.
    assert attempts.showed_work(Activity(3, (0, 95), 80.0), after_s=60, active_s=5)
    assert not attempts.showed_work(Activity(3, (0, 95), 20.0), after_s=60, active_s=5)
    assert not attempts.showed_work(steady, after_s=0, active_s=0)  # 0: the rule is off
    assert not attempts.showed_work(None, after_s=0, active_s=1)


def test_a_parsed_attempt_keeps_the_step_rule():
    busy = Activity(300, tuple(range(64)), 70.0)
    resumed = Resume("/c/ckpt-50", 50, "resume")
    # Parsed steps that never passed the resume step: no progress, whatever the output shows.
    assert not attempts.progressed(True, 50, resumed, busy, after_s=10, active_s=5)
    assert attempts.progressed(True, 51, resumed, None)
    assert attempts.progressed(False, None, FRESH, busy, after_s=10, active_s=5)
    assert not attempts.progressed(False, None, FRESH, None)


def _crash_after(activity: Activity | None) -> tuple[Machine, list]:
    m = Machine(cfg(policy={"backoff_initial_s": 10.0, "backoff_jitter": 0.0, "blind_progress_after_s": 5.0,
                            "blind_progress_active_s": 3}), Path("/state"))
    out = m.handle(Boot())
    assert isinstance(out[-1], PrepareLaunch)
    m.handle(Prepared(resume=FRESH))
    m.handle(Spawned(10, 10, ["python", "train.py"], T0))
    assert m.state is State.STARTING  # no metric ever parsed
    out = m.handle(JobExited(ExitInfo(1, None, Cause.CRASH,
                                      "exit 1"), False, T0 + 40, W0 + 40, activity=activity))
    return m, out


def test_a_blind_crash_after_work_is_a_crash_that_made_progress_no_backoff():
    m, out = _crash_after(Activity(120, tuple(range(0, 40)), None))
    end = next(c for c in out if isinstance(c, EndAttempt))
    assert end.cause is not None and end.cause.value == "crash" and end.progressed
    assert next(c for c in out if isinstance(c, ArmTimer)).delay_s == 0.0
    sched = next(c for c in out if isinstance(c, Record) and c.event == "restart_scheduled")
    assert "made progress" in sched.message and m.state is State.BACKOFF


def test_a_blind_crash_at_startup_backs_off_as_before():
    m, out = _crash_after(Activity(30, (0, 1, 39), None))  # start-up lines, then the traceback
    end = next(c for c in out if isinstance(c, EndAttempt))
    assert not end.progressed
    assert next(c for c in out if isinstance(c, ArmTimer)).delay_s == 10.0
