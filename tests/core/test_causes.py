"""One entry per cause: the policy, the state machine and the docs all read the registry."""
from __future__ import annotations

from pathlib import Path

from supervisor.config.model import config_from_table
from supervisor.config.doc import render
from supervisor.core.causes import (CAUSES, GATE_FAILURES, README_BEGIN, README_END, Action, Cause, GateCheck,
                                    StopStyle, gate_failure, readme_table)
from supervisor.core.policy import Failure, decide

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


def test_the_readme_table_is_generated_from_the_registry():
    text = (ROOT / "README.md").read_text()
    begin, end = text.index(README_BEGIN) + len(README_BEGIN), text.index(README_END)
    assert text[begin:end].strip() == readme_table(), \
        "run `python -m supervisor.core.causes` and paste the table into README.md"
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
