"""The resume_ignored rule, and the post-restart validation verdict that names it."""
from __future__ import annotations

import pytest

from supervisor.core.settings import ValidationConfig
from supervisor.core.resumecheck import MIN_GAP, resume_ignored
from supervisor.core.validation import Baseline, Validator
from supervisor.core.observations import MetricRecord


@pytest.mark.parametrize("resume, first, ignored", [
    (20, 1, True),  # started over
    (20, 0, True),
    (1000, 400, True),
    (20, 21, False),  # resumed: the next step
    (20, 20, False),  # resumed: the step itself logged again
    (20, 30, False),  # a job that logs every 10 steps
    (20, 10, False),  # half the resume step: not "far below"
    (5, 1, False),  # a very early checkpoint: the gap is below the minimum
    (MIN_GAP + 1, 0, True),
    (None, 1, False),
    (20, None, False),
])
def test_the_rule(resume: int | None, first: int | None, ignored: bool) -> None:
    got = resume_ignored(resume, first, "/c/checkpoint-20")
    assert (got is not None) == ignored
    if got is not None:
        assert got.to_json()["resume_step"] == resume and got.to_json()["first_step"] == first
        assert f"step {resume}" in got.message and "/c/checkpoint-20" in got.message


def rec(step: int, loss: float = 2.0) -> MetricRecord:
    return MetricRecord(step=step, loss=loss, source="stdout", at=0.0)


def validator(resume_step: int) -> Validator:
    history = [rec(s, 2.0) for s in range(1, resume_step + 1)]
    return Validator(ValidationConfig(steps=5), Baseline.from_history(history, resume_step, []), resume_step, 0.0)


def test_the_verdict_names_a_resume_the_job_ignored() -> None:
    v = validator(20)
    verdict = v.feed([rec(1), rec(2)], 1.0)
    assert verdict is not None and not verdict.passed
    js = verdict.to_json()
    assert js["verdict"] == "fail" and "resume_ignored" in js["summary"]
    assert js["checks"]["resume"]["passed"] is False and js["checks"]["resume"]["value"] == 1
    assert js["checks"]["resume"]["reference"] == 20
    assert v.feed([rec(25)], 2.0) is None  # judged once


def test_a_real_resume_is_validated_as_before() -> None:
    v = validator(20)
    assert v.feed([rec(21), rec(22)], 1.0) is None
    verdict = v.feed([rec(25)], 2.0)
    assert verdict is not None and verdict.passed and "resume" not in verdict.to_json()["checks"]
