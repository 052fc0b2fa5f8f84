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
