"""One entry per cause: the policy, the state machine and the docs all read the registry."""
from __future__ import annotations

from pathlib import Path

from supervisor.config.model import config_from_table
from supervisor.config.doc import render
from supervisor.checkpoints.resumechoice import action_mode as _action_mode
from supervisor.core import attempts
from supervisor.core.causes import (ACTIONS, CAUSES, GATE_FAILURES, README_BEGIN, README_END, Action, Cause,
                                    GateCheck, StopStyle, gate_failure, readme_table)
from supervisor.core.messages import Mode
from supervisor.core.policy import Failure, decide, relaunch_delay

ROOT = Path(__file__).resolve().parents[2]


def test_every_cause_has_one_entry_and_the_policy_takes_its_default_from_it():
    assert set(CAUSES) == set(Cause)
    cfg = config_from_table({"job": {"command": ["true"]}})
    for cause, spec in CAUSES.items():
        assert spec.cause is cause and spec.doc
        assert decide(cfg, [], Failure(cause, "x"), now=0, ran_s=1).action is spec.default


def test_the_special_cases_are_data():
    hung = [c for c, s in CAUSES.items() if s.stop is StopStyle.HUNG]
    assert hung == [Cause.HANG]
    assert [c for c, s in CAUSES.items() if not s.counted] == [Cause.MANUAL]
    assert [c for c, s in CAUSES.items() if s.diagnostics] == [Cause.VALIDATION_FAILED]


def test_every_action_has_one_spec_and_every_consumer_reads_it():
    """The policy, the shutdown plan and the checkpoint chooser act on an action's spec, not its
    name: configuring each action for a crash gives what its spec says, in each of them."""
    assert set(ACTIONS) == set(Action)
    for action, spec in ACTIONS.items():
        assert spec.action is action and spec.doc
        cfg = config_from_table({"job": {"command": ["true"]}, "shutdown": {"mode": "hybrid"},
                                 "on": {"crash": {"action": action.value}}})
        d = decide(cfg, [], Failure(Cause.CRASH, "exit 1"), now=0, ran_s=1)
        assert d.action is action and d.relaunch is spec.relaunches
        if not spec.ends_attempt:
            assert "keeps running" in d.reason
        plan = attempts.shutdown_plan(cfg, Cause.CRASH, d)
        assert (plan.mode is Mode.HYBRID) is spec.emergency_checkpoint, action
        assert _action_mode(action) == ("rollback" if spec.before_onset else "restart")
        assert attempts.what_next(d).startswith("giving up") is (not spec.relaunches)


def test_the_per_cause_relaunch_facts_are_data_and_the_backoff_reads_them():
    cfg = config_from_table({"job": {"command": ["true"]}, "policy": {"backoff_initial_s": 5.0}})
    at_once = [c for c, s in CAUSES.items() if s.rollback_at_once]
    assert at_once == [Cause.NAN, Cause.LOSS_SPIKE]
    assert [c for c, s in CAUSES.items() if s.no_backoff] == [Cause.CHECKPOINT_LOAD_ERROR]
    for cause in Cause:
        spec = CAUSES[cause]
        for action in (Action.RESTART, Action.ROLLBACK):
            delay, why = relaunch_delay(cfg, [], cause, action, ran_s=1, progressed=False, jitter_draw=0.0)
            waits = not ((spec.rollback_at_once and ACTIONS[action].before_onset) or spec.no_backoff)
            assert (delay > 0) is waits, (cause, action, why)


def test_the_readme_table_is_generated_from_the_registry():
    text = (ROOT / "docs" / "how-it-decides.md").read_text()
    begin, end = text.index(README_BEGIN) + len(README_BEGIN), text.index(README_END)
    assert text[begin:end].strip() == readme_table(), \
        "run `python -m supervisor.core.causes` and paste the table into docs/how-it-decides.md"
    for cause in Cause:
        assert f"| `{cause.value}` |" in readme_table()


def test_the_config_docs_list_every_cause_with_its_default():
    on = render().split("[on.nan]")[0]
    for cause, spec in CAUSES.items():
        assert any(line.split()[1:3] == [cause.value, spec.default.value]
                   for line in on.splitlines() if line.startswith("#   ")), cause
    assert ", ".join(a.value for a in Action) in on


def test_every_gate_check_names_a_cause_and_the_first_failure_is_the_root():
    assert set(GATE_FAILURES) == set(GateCheck)
    assert gate_failure([GateCheck.STORAGE])[0] is Cause.DISK_LOW
    assert gate_failure([GateCheck.GPU_COUNT, GateCheck.STORAGE])[0] is Cause.GPU_FAULT
