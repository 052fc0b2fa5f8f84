"""Signs of a divergence before the NaN (watch/precursor.py): a grad-norm ramp, repeated loss-scale
halvings, a creeping loss; and nothing at all on a healthy run's noise."""
from __future__ import annotations

import dataclasses
import math
import random

from supervisor.core.observations import MetricRecord
from supervisor.watch.config import PrecursorConfig
from supervisor.watch.precursor import PrecursorWatch

CFG = PrecursorConfig(warmup_steps=20)


def rec(step: int, loss: float | None = None, grad: float | None = None, at: float | None = None,
        **extra: float) -> MetricRecord:
    return MetricRecord(step=step, loss=loss, grad_norm=grad, at=float(step) if at is None else at, extra=extra)


def healthy(rng: random.Random, step: int) -> MetricRecord:
    """A decaying loss with noise and a noisy grad norm, an occasional lone outlier included."""
    loss = 4.0 * math.exp(-step / 2000) + 1.0 + rng.gauss(0, 0.05)
    grad = abs(rng.gauss(1.0, 0.15)) * (4.0 if rng.random() < 0.005 else 1.0)
    return rec(step, loss, grad, scale=65536.0 / (2 if rng.random() < 0.003 else 1))


def test_a_healthy_3000_step_run_asks_for_nothing():
    rng = random.Random(3)
    w = PrecursorWatch(CFG)
    fired = [p for s in range(1, 3001) if (p := w.feed(healthy(rng, s))) is not None]
    assert fired == []


def test_a_grad_norm_ramp_is_seen_within_patience_records_of_its_start():
    rng = random.Random(5)
    w = PrecursorWatch(CFG)
    for s in range(1, 301):
        assert w.feed(healthy(rng, s)) is None
    found = None
    for i, s in enumerate(range(301, 320)):
        found = w.feed(rec(s, 1.6, 1.0 * 1.8 ** (i + 1)))
        if found is not None:
            break
    assert found is not None and found.kind == "grad_norm_ramp", found
    assert found.step is not None and found.step <= 301 + CFG.patience + 2, found  # early in the ramp
    assert "above 3x its median" in found.reason


def test_repeated_loss_scale_halvings_and_a_creeping_loss():
    w = PrecursorWatch(CFG)
    scale = 65536.0
    got = None
    for s in range(1, 200):
        if s > 150 and s % 5 == 0:
            scale /= 2
        got = w.feed(rec(s, 2.0, 1.0, loss_scale=scale)) or got
    assert got is not None and got.kind == "loss_scale_drops"
    rng = random.Random(9)
    w2 = PrecursorWatch(CFG)
    for s in range(1, 200):
        w2.feed(rec(s, 2.0 + rng.gauss(0, 0.01), 1.0))
    rising = [w2.feed(rec(s, 2.0 + 0.05 * (s - 199), 1.0)) for s in range(200, 210)]
    assert any(p is not None and p.kind == "loss_rising" for p in rising), rising


def test_rate_limited_warmup_respected_and_reset_per_attempt():
    cfg = dataclasses.replace(CFG, min_interval_s=100.0)
    w = PrecursorWatch(cfg)
    for s in range(1, 101):
        w.feed(rec(s, 2.0, 1.0))
    first = [w.feed(rec(s, 2.0, 50.0)) for s in range(101, 110)]
    assert sum(p is not None for p in first) == 1  # one request, then the rate limit
    # A resumed attempt: its first warmup_steps are never judged, whatever they show.
    w.reset(resume_step=500)
    assert all(w.feed(rec(s, 2.0, 1e6, at=10_000.0 + s)) is None for s in range(501, 515))
    assert not PrecursorWatch(dataclasses.replace(CFG, enabled=False)).feed(rec(999, 2.0, 1e9))


def test_the_rolling_baseline_gives_statistics_median_and_mad_exactly():
    """The MAD is read off the sorted window by bisection (no sort per record, the main loop's
    cost in a burst): it must be the very figure statistics.median gives, ties and windows of odd
    and even length included."""
    import statistics

    from supervisor.watch.precursor import _Robust

    rng = random.Random(11)
    for _ in range(2000):
        window = rng.choice([10, 11, 50, 100])
        robust = _Robust(window)
        for _ in range(rng.randint(1, 3 * window)):
            robust.accept(rng.choice([rng.random(), rng.randint(0, 3) * 0.5, rng.gauss(0, 1e3), 1.0]))
        values = list(robust.values)
        med = statistics.median(values)
        assert robust.stats() == (med, 1.4826 * statistics.median([abs(v - med) for v in values]))


def test_the_loss_scale_window_forgets_its_old_highest_value():
    """The sliding maximum of the loss scale: a scale more than ``window`` records old no longer
    counts (two halvings below a value 15 records back ask for nothing), one within it does."""
    cfg = dataclasses.replace(CFG, window=10, min_points=5, warmup_steps=0, scale_drops=2, min_interval_s=0)
    w = PrecursorWatch(cfg)
    assert w.feed(rec(1, 2.0, scale=65536.0)) is None
    assert [w.feed(rec(s, 2.0, scale=32768.0)) for s in range(2, 16)] == [None] * 14
    assert w.feed(rec(16, 2.0, scale=16384.0)) is None  # 65536 fell out of the window at record 11
    assert w.feed(rec(17, 2.0, scale=65536.0)) is None
    found = w.feed(rec(18, 2.0, scale=16384.0))
    assert found is not None and found.kind == "loss_scale_drops" and found.step == 18
