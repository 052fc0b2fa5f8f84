"""The checkpoint interval advice (core/interval.py) against a simulation of failures with a known
rate: the model's expected goodput matches the simulated one, and the advised interval is within
5 % of the best interval found by searching it."""
from __future__ import annotations

import random

import pytest

from supervisor.core.interval import (advise, daly_interval, expected_goodput, mtbf, save_cost_from_rhythm)


def simulate(interval_s: float, save_cost_s: float, mtbf_s: float, restart_s: float, work_s: float,
             seed: int) -> float:
    """Goodput of a run doing ``work_s`` of training, a save after every ``interval_s`` of it,
    exponential failures: a failure loses the segment under way and costs a restart (which may
    fail too)."""
    rng = random.Random(seed)
    t, done = 0.0, 0.0
    next_fail = rng.expovariate(1 / mtbf_s)
    failed = False
    while done < work_s:
        if failed:  # the restart first
            if t + restart_s > next_fail:
                t, next_fail = next_fail, next_fail + rng.expovariate(1 / mtbf_s)
                continue
            t += restart_s
            failed = False
        seg = interval_s + save_cost_s
        if t + seg > next_fail:
            t, next_fail = next_fail, next_fail + rng.expovariate(1 / mtbf_s)
            failed = True
            continue
        t += seg
        done += interval_s
    return done / t


@pytest.mark.parametrize("save_cost_s,mtbf_s,restart_s", [(60.0, 3600.0, 90.0), (20.0, 4 * 3600.0, 30.0),
                                                           (300.0, 2 * 3600.0, 120.0)])
def test_the_model_matches_a_simulation_and_the_advice_is_the_searched_optimum(save_cost_s, mtbf_s, restart_s):
    advised = daly_interval(save_cost_s, mtbf_s)
    work = 4000 * mtbf_s  # thousands of failures: the simulated goodput is within a fraction of a percent
    for t in (advised / 3, advised, advised * 3):
        sim = simulate(t, save_cost_s, mtbf_s, restart_s, work, seed=7)
        assert sim == pytest.approx(expected_goodput(t, save_cost_s, mtbf_s, restart_s), rel=0.02), t
    # The best interval found by search over the model, and on the simulation with the same failures.
    grid = [advised * f / 100 for f in range(20, 301)]
    best = max(grid, key=lambda t: expected_goodput(t, save_cost_s, mtbf_s, restart_s))
    assert abs(advised - best) / best <= 0.05, (advised, best)
    coarse = [advised * f / 10 for f in range(3, 31)]
    sims = {t: simulate(t, save_cost_s, mtbf_s, restart_s, work, seed=11) for t in coarse}
    best_sim = max(sims.values())
    assert simulate(advised, save_cost_s, mtbf_s, restart_s, work, seed=11) >= best_sim - 0.005


def test_edges_of_the_formula():
    assert daly_interval(0.0, 3600.0) == 0.0  # free saves: as often as the job can
    assert daly_interval(10_000.0, 3600.0) == 3600.0  # saves dearer than half the MTBF: one per MTBF
    with pytest.raises(ValueError):
        daly_interval(10.0, 0.0)
    assert expected_goodput(100.0, 10.0, 1e9) == pytest.approx(100 / 110, rel=1e-3)  # no failures: only saves
    assert expected_goodput(1e9, 10.0, 60.0) == 0.0  # a segment that never finishes


def test_the_save_cost_is_read_from_the_step_rhythm_around_the_saves():
    steps, t = [], 0.0
    saves = []
    for i in range(60):
        t += 1.0
        if i in (20, 40):
            saves.append(t + 0.5)  # the save ends inside this step's interval
            t += 5.0
        steps.append(t)
    assert save_cost_from_rhythm(steps, saves) == pytest.approx(5.0)
    assert save_cost_from_rhythm(steps[:3], saves) is None
    assert save_cost_from_rhythm(steps, []) is None


def test_no_advice_before_the_first_failure_and_a_line_that_says_what_the_interval_costs():
    assert mtbf(3600.0, 0) is None and advise(save_cost_s=30.0, run_seconds=3600.0, failures=0) is None
    a = advise(save_cost_s=30.0, run_seconds=10 * 3600.0, failures=5, restart_s=60.0, current_s=300.0)
    assert a is not None and a.mtbf_s == 7200.0
    assert a.advised_s == pytest.approx(daly_interval(30.0, 7200.0))
    assert a.goodput_now is not None and a.goodput_advised > a.goodput_now
    line = a.line()
    assert "saving every 5 min costs" in line and "would cost" in line and "one per 2.0 h" in line
    assert a.to_json()["failures"] == 5
