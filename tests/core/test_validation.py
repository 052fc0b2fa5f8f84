"""Post-reboot validation (``supervisor/core/validation.py``) as pure functions: records in, verdict out."""
from __future__ import annotations

import math

import pytest

from supervisor.core.settings import ValidationConfig
from supervisor.core.observations import MetricRecord
from supervisor.core.validation import Baseline, Validator, _merge


def rec(step: int, loss: float | None = 2.0, gn: float | None = 1.0, tps: float | None = 1000.0,
        at: float = 0.0) -> MetricRecord:
    return MetricRecord(step=step, loss=loss, grad_norm=gn, tokens_per_sec=tps, at=at)


def history(upto: int = 100, loss: float = 2.0) -> list[MetricRecord]:
    # A little per-batch noise around ``loss``; grad norms 1.0..1.9; throughput 1000.
    return [rec(s, loss + 0.01 * ((s % 5) - 2), 1.0 + 0.1 * (s % 10)) for s in range(1, upto + 1)]


def validator(cfg: ValidationConfig | None = None, resume: int = 100, startups: list[float] | None = None,
              started_at: float = 0.0) -> Validator:
    cfg = cfg or ValidationConfig(steps=5)
    return Validator(cfg, Baseline.from_history(history(), resume, startups or [10.0]), resume, started_at)


def test_baseline_is_the_median_loss_of_the_window_up_to_the_resumed_step():
    b = Baseline.from_history(history(), 100, [10.0, 30.0, 20.0])
    assert b.loss_at_resume == pytest.approx(2.0)
    assert b.loss_spread is not None and 0 < b.loss_spread < 0.05
    assert b.grad_norm_p99 == pytest.approx(1.9) and b.throughput_median == 1000.0
    assert b.startup_median_s == 20.0


def test_baseline_skips_non_finite_values_takes_the_latest_record_of_a_step_and_needs_enough_data():
    recs = [rec(s, 2.0) for s in range(1, 9)] + [rec(8, 5.0), rec(9, math.nan, gn=math.inf)]
    b = Baseline.from_history(recs, 9, [])
    assert b.loss_at_resume == 2.0, "the NaN at step 9 is left out; the median of the rest"
    assert Baseline.from_history(recs, 8, [], window=1).loss_at_resume == 5.0, "the latest record of step 8"
    assert b.grad_norm_p99 is None, "fewer than 10 finite grad norms: no distribution"
    assert b.startup_median_s is None
    assert Baseline.from_history(recs, None, []).loss_at_resume is None
    few = Baseline.from_history([rec(s, tps=100.0) for s in range(4)], 3, [])
    assert few.throughput_median is None, "fewer than 5 throughput readings: no baseline"


def test_steps_up_to_the_resumed_one_are_not_judged_and_the_verdict_comes_after_cfg_steps():
    v = validator()
    assert v.feed([rec(s) for s in range(90, 101)], now=5.0) is None and not v.seen
    assert v.feed([rec(101), rec(102), rec(103), rec(104)], now=12.0) is None
    verdict = v.feed([rec(105)], now=13.0)
    assert verdict is not None and verdict.passed and verdict.steps_seen == 5 and verdict.resume_step == 100
    assert {c.name for c in verdict.checks} == {"initial_loss", "grad_norm", "throughput", "startup"}
    assert v.feed([rec(106)], now=14.0) is None, "one verdict per attempt"
    assert verdict.to_json()["verdict"] == "pass"


def test_a_loss_well_above_the_resumed_one_fails_and_says_by_how_much():
    v = validator()
    verdict = v.feed([rec(s, loss=3.0) for s in range(101, 106)], now=12.0)
    assert verdict is not None and not verdict.passed
    loss = {c.name: c for c in verdict.checks}["initial_loss"]
    assert loss.passed is False and loss.note == "+50.0%" and "initial_loss" in verdict.summary


def test_a_loss_that_keeps_falling_passes_the_one_sided_check():
    verdict = validator().feed([rec(s, loss=1.2) for s in range(101, 106)], now=12.0)
    assert verdict is not None and verdict.passed


@pytest.mark.parametrize("bad, check", [
    ({"gn": 50.0}, "grad_norm"),  # above p99 (1.9) x 3
    ({"tps": 100.0}, "throughput"),  # below 80 % of the median
])
def test_grad_norm_and_throughput_outside_their_limits_fail(bad, check):
    verdict = validator().feed([rec(s, **bad) for s in range(101, 106)], now=12.0)
    assert verdict is not None and not verdict.passed
    assert [c.name for c in verdict.checks if c.passed is False] == [check]


def test_a_slow_first_step_fails_the_startup_check():
    v = validator(startups=[10.0])  # limit: 5 x 10 s
    verdict = v.feed([rec(s) for s in range(101, 106)], now=80.0)
    assert verdict is not None and not verdict.passed
    assert {c.name: c.passed for c in verdict.checks}["startup"] is False


def test_without_a_baseline_the_checks_are_skipped_not_passed():
    v = Validator(ValidationConfig(steps=3), Baseline(None, None, None, None, None), 10, 0.0)
    verdict = v.feed([rec(s) for s in range(11, 14)], now=1.0)
    assert verdict is not None and verdict.passed
    assert all(c.passed is None for c in verdict.checks) and "no baseline" in verdict.summary


def test_no_step_within_the_first_step_timeout_fails_and_an_early_end_is_incomplete():
    v = validator(ValidationConfig(steps=5, first_step_timeout_s=60.0), started_at=100.0)
    assert v.poll(150.0) is None
    verdict = v.poll(161.0)
    assert verdict is not None and not verdict.passed and verdict.checks[0].name == "first_step"
    w = validator()
    w.feed([rec(101), rec(102)], now=3.0)
    assert w.poll(10_000.0) is None, "a step arrived: no first-step timeout"
    inc = w.incomplete()
    assert inc["verdict"] == "incomplete" and inc["steps"] == 2 and inc["passed"] is None


def test_two_records_of_one_step_are_merged():
    a = MetricRecord(step=5, loss=2.0, source="stdout", extra={"lr": 1.0}, at=0.0)
    b = MetricRecord(step=5, grad_norm=1.5, tokens_per_sec=10.0, source="client", extra={"mfu": 0.4}, at=0.0)
    m = _merge(a, b)
    assert (m.loss, m.grad_norm, m.tokens_per_sec, m.source) == (2.0, 1.5, 10.0, "client")
    assert dict(m.extra) == {"lr": 1.0, "mfu": 0.4}
    v = validator(ValidationConfig(steps=1))
    verdict = v.feed([MetricRecord(step=101, loss=2.0, at=0.0), MetricRecord(step=101, grad_norm=1.0, at=0.0)], now=1.0)
    assert verdict is not None and {c.name: c.value for c in verdict.checks}["grad_norm"] == 1.0


def test_the_window_counts_training_steps_from_the_resume_step_not_metric_records():
    # A job that prints every 10 steps: a 20-step window ends at its print of step resume + 20.
    v = validator(ValidationConfig(steps=20))
    assert v.feed([rec(110)], now=1.0) is None and v.steps_covered() == 10
    verdict = v.feed([rec(120)], now=2.0)
    assert verdict is not None and verdict.passed, "two prints cover the 20 steps after step 100"
    assert verdict.steps_seen == 20 and verdict.records == 2
    assert verdict.to_json()["steps"] == 20 and "over 20 steps (2 metric records)" in verdict.summary


def test_records_past_the_window_are_not_judged_and_a_sparse_printer_is_judged_on_its_first_print():
    v = validator(ValidationConfig(steps=20))
    verdict = v.feed([rec(110), rec(120), rec(130, loss=50.0)], now=1.0)
    assert verdict is not None and verdict.passed, "step 130 lies past the window (100..120)"
    assert verdict.records == 2
    w = validator(ValidationConfig(steps=20))
    verdict = w.feed([rec(150, loss=50.0)], now=1.0)
    assert verdict is not None and not verdict.passed, "one print every 50 steps: judged on it"
    assert verdict.steps_seen == 20 and verdict.records == 1


def test_without_a_resume_step_the_window_counts_from_the_first_step_seen():
    v = Validator(ValidationConfig(steps=20), Baseline(None, None, None, None, None), None, 0.0)
    assert v.feed([rec(10)], now=1.0) is None and v.window_start() == 9
    assert v.feed([rec(20)], now=2.0) is None
    assert v.feed([rec(29)], now=3.0) is not None, "steps 10..29: twenty steps"


def test_an_early_end_of_a_sparse_printer_says_steps_and_records():
    v = validator(ValidationConfig(steps=20))
    v.feed([rec(110)], now=1.0)
    inc = v.incomplete()
    assert inc["steps"] == 10 and inc["records"] == 1 and "10 of 20 validation steps" in inc["summary"]


def test_an_attempt_that_ends_before_its_first_step_is_incomplete_with_no_step_covered():
    # A stop during the job's start-up (resume step known, no step printed yet): before, max() of
    # no steps raised and the validation concern logged concern_failed instead of the verdict.
    v = validator()
    assert v.resume_step is not None and not v.seen
    inc = v.incomplete()
    assert inc["verdict"] == "incomplete" and inc["steps"] == 0 and inc["records"] == 0
