"""A falling fp16 loss scale is the scaler at work, not a divergence (issue 34, G9).

Megatron's warm-up starts at a loss scale of 2^32 and halves it every 2 overflows (hysteresis 2):
32 skipped steps in a row, each a finite loss beside ``grad_norm inf``. Counting them toward
``[detectors.nan] overflow_steps`` (20) rolled the warm-up back and then gave up on a healthy run.
Now only records at a scale that no longer falls, or at its floor, count.
"""

from __future__ import annotations

import pytest

from supervisor.events import Cause
from supervisor.core.observations import Detection
from supervisor.watch.config import DetectorsConfig, NanDetectorConfig
from supervisor.watch.logwatch import LogWatcher

K = NanDetectorConfig().overflow_steps


def watch(cfg: DetectorsConfig | None = None) -> tuple[LogWatcher, list[Detection]]:
    dets: list[Detection] = []
    w = LogWatcher(cfg or DetectorsConfig(), dets.append, lambda _r: None)
    w.reset(0, None)
    return w, dets


def warmup(first: int, steps: int, scale: float = 2.0**32, every: int = 2, fmt: str = "step {s} loss 10.8 grad_norm inf "
           "loss_scale {sc}") -> tuple[list[str], float]:
    """``steps`` overflow records from step ``first``, the scale halved every ``every`` of them."""
    out = []
    for i in range(steps):
        out.append(fmt.format(s=first + i, sc=scale))
        if (i + 1) % every == 0:
            scale /= 2
    return out, scale


@pytest.mark.parametrize("fmt", [
    "step {s} loss 10.8 grad_norm inf loss_scale {sc}",
    " iteration {s:8d}/  100000 | lm loss: 1.080000E+01 | loss scale: {sc:.1f} | grad norm: inf | "
    "number of skipped iterations:   1 | number of nan iterations:   0 |",
    "{{'loss': 10.8, 'grad_norm': inf, 'loss_scale': {sc}, 'step': {s}}}",
])
def test_a_falling_loss_scale_never_counts_however_long_the_streak(fmt: str) -> None:
    w, dets = watch()
    lines, scale = warmup(1, 60, fmt=fmt)  # 60 skipped steps, scale 2^32 down to 2^2: longer than any warm-up
    w.feed("stdout", lines)
    assert scale > 1 and dets == [], dets
    w.feed("stdout", [f"step {s} loss 10.7 grad_norm 3.2 loss_scale {scale}" for s in (61, 62)])
    assert dets == []


def test_a_scale_halved_every_record_also_never_counts() -> None:
    w, dets = watch()
    w.feed("stdout", warmup(1, 31, every=1)[0])  # PyTorch's GradScaler: backoff at every overflow
    assert dets == []


def test_a_stuck_scale_at_inf_grad_norms_for_overflow_steps_records_is_a_detection() -> None:
    w, dets = watch()
    w.feed("stdout", ["step 9 loss 2.0 grad_norm 1.0 loss_scale 65536.0"])
    falling, scale = warmup(10, 10, scale=65536.0)  # the scaler works for 10 records: none count
    w.feed("stdout", falling)
    # then the scale stops falling (a scaler that no longer backs off): these count, from step 20 on,
    # where it fell to its last value
    w.feed("stdout", [f"step {s} loss 2.0 grad_norm inf loss_scale {scale}" for s in range(20, 20 + K - 1)])
    assert dets == []
    w.feed("stdout", [f"step {20 + K - 1} loss 2.0 grad_norm inf loss_scale {scale * 4}"])  # a higher one counts too
    [d] = dets
    assert d.cause is Cause.NAN and d.step == 20 + K - 1 and d.onset_step == 10, d
    assert d.details["overflow"] is True and d.details["consecutive"] == K and d.details["loss_scale"] == scale * 4
    # the message says what the evidence shows: the scale did not fall, not that nothing was skipped
    assert "no longer falls" in d.summary and f"since step {20 + K - 1}" in d.summary, d.summary
    assert "not skipping" not in d.summary


def test_a_record_at_the_same_scale_between_two_falls_does_not_add_up() -> None:
    # hysteresis: the same scale for up to a few records, then a lower one; the count never reaches K
    w, dets = watch(DetectorsConfig(nan=NanDetectorConfig(overflow_steps=3)))
    w.feed("stdout", warmup(1, 40, every=2)[0])
    assert dets == []
    w, dets = watch(DetectorsConfig(nan=NanDetectorConfig(overflow_steps=3)))
    w.feed("stdout", warmup(1, 40, every=3)[0])  # 3 records at one scale: overflow_steps=3 of them count
    [d] = dets
    assert d.step == 3 and d.details["consecutive"] == 3


@pytest.mark.parametrize(("floor_field", "floor"), [("", 1.0), (" min_loss_scale 16.0", 16.0)])
def test_a_scale_at_its_floor_counts(floor_field: str, floor: float) -> None:
    w, dets = watch()
    # falling from 2^10 every record down to the floor, then held there: the scaler cannot lower it
    lines = [f"step {s} loss 2.0 grad_norm inf loss_scale {max(2.0 ** (11 - s), floor)}{floor_field}"
             for s in range(1, 60)]
    w.feed("stdout", lines)
    [d] = dets
    at_floor = next(s for s in range(1, 60) if 2.0 ** (11 - s) <= floor)  # the first record at the floor
    # the count starts at the last fall above the floor (the record before it) and goes on at the floor
    assert d.step == at_floor + K - 2 and d.details["consecutive"] == K and d.details["scale_floor"] == floor, d
    assert d.onset_step == 1 and "at its floor" in d.summary and f"floor is {floor:g}" in d.summary, d.summary


def test_without_a_loss_scale_the_plain_streak_counts() -> None:
    w, dets = watch()
    w.feed("stdout", [f"step {s} loss 2.0 grad_norm inf" for s in range(1, 1 + K)])
    [d] = dets
    assert d.step == K and d.details["consecutive"] == K and "loss_scale" not in d.details
    assert "no loss scale printed" in d.summary


def test_a_new_attempt_and_a_finite_grad_norm_start_the_scale_over() -> None:
    # a scale remembered from the last streak must not make the next one's first record look "falling"
    w, dets = watch(DetectorsConfig(nan=NanDetectorConfig(overflow_steps=2)))
    w.feed("stdout", ["step 1 loss 2 grad_norm inf loss_scale 1024.0", "step 2 loss 2 grad_norm 1 loss_scale 1024.0",
                      "step 3 loss 2 grad_norm inf loss_scale 512.0", "step 4 loss 2 grad_norm inf loss_scale 512.0"])
    [d] = dets
    assert d.step == 4 and d.onset_step == 3
    w.reset(1, 2)
    w.feed("stdout", ["step 3 loss 2 grad_norm inf loss_scale 256.0", "step 4 loss 2 grad_norm inf loss_scale 256.0"])
    assert len(dets) == 2 and dets[1].step == 4
