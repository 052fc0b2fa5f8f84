"""The attempt bookkeeping the machine delegates to: pure functions, checked one by one."""
from __future__ import annotations

import signal
from pathlib import Path
from types import MappingProxyType

from supervisor.core import attempts
from supervisor.core.causes import Action, Cause
from supervisor.core.messages import FRESH_START, Mode, Resume
from supervisor.core.policy import AppliedRemedies, Decision
from supervisor.core.observations import Detection
from tests.core.test_machine import cfg


def test_a_hung_job_gets_the_short_grace_and_a_diverged_one_no_emergency_checkpoint():
    c = cfg(shutdown={"mode": "hybrid", "grace_s": 30.0, "hang_grace_s": 5.0})
    hung = attempts.shutdown_plan(c, Cause.HANG, None)
    assert (hung.mode, hung.grace_s, hung.reason) == (Mode.GRACEFUL, 5.0, "hang")
    rollback = attempts.shutdown_plan(c, Cause.NAN, Decision(Action.ROLLBACK, Cause.NAN, "nan"))
    assert (rollback.mode, rollback.grace_s) == (Mode.GRACEFUL, 30.0)
    operator = attempts.shutdown_plan(c, None, None)
    assert (operator.mode, operator.reason, operator.stop_signal) == (Mode.HYBRID, "stop", signal.SIGTERM)
    assert attempts.leftovers_plan(c).reason == "leftovers"


def test_progress_needs_a_metric_and_a_step_past_the_resume_point():
    at_100 = Resume("ckpt", 100, "newest valid")
    assert not attempts.progressed(False, 500, at_100)
    assert attempts.progressed(True, None, at_100)  # steps unknown: the metric is enough
    assert attempts.progressed(True, 5, FRESH_START)
    assert not attempts.progressed(True, 100, at_100)
    assert attempts.progressed(True, 101, at_100)


def test_onset_prefers_the_root_failure_and_its_onset():
    root = Detection(Cause.LOSS_SPIKE, "spike", "log", step=50, onset_step=42, at=0.0)
    late = Detection(Cause.NAN, "nan", "log", step=60, at=0.0)
    assert attempts.onset_step(root, late) == 42
    assert attempts.onset_step(None, late) == 60
    assert attempts.onset_step(None, None) is None


def test_stopped_code_says_which_signal_stopped_the_run():
    assert attempts.stopped_code(None) == 0
    assert attempts.stopped_code("SIGTERM") == 128 + signal.SIGTERM


def test_the_digest_sees_argv_and_chosen_env_only():
    d = attempts.launch_digest(["python", "t.py"], {"A": "1"}, 0, False)
    assert d == attempts.launch_digest(("python", "t.py"), {"A": "1"}, 0, False)
    assert d != attempts.launch_digest(["python", "t.py"], {"A": "2"}, 0, False)
    assert d != attempts.launch_digest(["python", "t.py"], {"A": "1"}, 0, True)


def test_records_name_what_happened_and_what_next():
    remedies = AppliedRemedies(MappingProxyType({"LR_SCALE": "0.5"}), rungs=(0,))
    d = Decision(Action.ROLLBACK, Cause.NAN, "policy", delay_s=2.0, restarts_in_window=1, max_restarts=5,
                 remedies=remedies)
    r = attempts.restart_scheduled(3, d, "loss nan", 12.5)
    assert r.event == "restart_scheduled" and "attempt 3 failed: nan (loss nan) after 12.5 s" in r.message
    assert r.data["remedies"] == remedies.as_json()
    assert attempts.remedies_applied(d).data["env"] == {"LR_SCALE": "0.5"}
    assert "in 2.0 s" in attempts.what_next(d)
    assert "giving up" in attempts.what_next(Decision(Action.GIVE_UP, Cause.NAN, "too many"))
    g = attempts.gave_up("too many", Cause.NAN, Path("/state"))
    assert g.level == "critical" and g.data == {"cause": "nan"} and "/state" in g.message
