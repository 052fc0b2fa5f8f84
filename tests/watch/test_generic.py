"""The generic parser (``supervisor/watch/generic.py``), the step of a hand-written loop's tqdm bar,
and NaN as a value in a metric, never a word in prose: through the real LogWatcher and detectors."""
from __future__ import annotations

import math

import pytest

from supervisor.events import Cause
from supervisor.core.observations import Detection, MetricRecord
from supervisor.watch.config import DetectorsConfig
from supervisor.watch.generic import parse_generic, strip_prefix
from supervisor.watch.logwatch import LogWatcher
from supervisor.watch.parsers import METRIC_KEYWORDS, MetricParser

P = MetricParser()


def watch() -> tuple[LogWatcher, list[Detection], list[MetricRecord]]:
    dets: list[Detection] = []
    recs: list[MetricRecord] = []
    return LogWatcher(DetectorsConfig(), dets.append, recs.append), dets, recs


# line -> (step, loss, val_loss, other expected attributes)
GENERIC = [
    ("2026-12-03 21:06:25,513 INFO trainer: epoch 0 | iter 60/300 | train_loss=nan | lr=0.05",
     60, math.nan, None, {"lr": 0.05, "extra": {"epoch": 0.0, "total": 300.0}}),
    ("2026-12-03 21:06:25,513 INFO trainer: epoch 0 | iter 60/300 | train_loss=2.4150 | lr=0.05",
     60, 2.415, None, {}),
    ("[2026-12-03 21:06:25] INFO epoch 1, it 60, loss: 2.31, lr 3e-4", 60, 2.31, None, {"lr": 3e-4}),
    ("INFO:root:it 60 train/loss=2.31 grad_norm=1.2", 60, 2.31, None, {"grad_norm": 1.2}),
    ("INFO:__main__:iter 7 | lm loss: 7.3E+00 | grad norm: 1.5", 7, 7.3, None, {"grad_norm": 1.5}),
    ("Epoch [1/10], Step [60/300], Loss: 2.3012", 60, 2.3012, None, {"extra": {"epoch": 1.0, "total": 300.0}}),
    ("2026-12-03 21:06:25,513 - trainer - INFO - iter 12 | loss_step=inf | tok/s 1,234", 12, math.inf, None,
     {"tokens_per_sec": 1234.0}),
    ("12/03/2026 21:06:25 - INFO - __main__ - iteration 8 train loss 2.1 val loss 2.2", 8, 2.1, 2.2, {}),
    ("iter 100 loss 2.3", 100, 2.3, None, {}),
    (" iteration 100 | lm loss: 7.3 |", 100, 7.3, None, {}),
    ("INFO loss: 2.3", None, 2.3, None, {}),
    ("eval_loss=2.5 | epoch 2", None, None, 2.5, {"extra": {"epoch": 2.0}}),
    ("[rank1]: 2026-12-03 21:06:25,513 INFO trainer: iter 61 | loss=2.0 | 41.2 ms", 61, 2.0, None, {"rank": 1}),
    ("58/300 loss=nan lr=0.1", 58, math.nan, None, {"lr": 0.1, "extra": {"total": 300.0}}),
    ("[58/300] loss: 2.0 | eta: 0:03:12 | 120 tok/s", 58, 2.0, None, {}),
    ("step 9 | loss 2.0 | elapsed 00:01:02.5", 9, 2.0, None, {}),
    ("iteration 100: loss 2.3", 100, 2.3, None, {}),
    ("step 250: train loss 2.0", 250, 2.0, None, {}),  # nanoGPT's eval line without its val part: not "nanogpt"
    ("Epoch 3: val_loss=2.1 train_loss=2.0", None, 2.0, 2.1, {"extra": {"epoch": 3.0}}),
]


@pytest.mark.parametrize("line,step,loss,val_loss,more", GENERIC)
def test_ordinary_log_lines_parse(line: str, step: int | None, loss: float | None, val_loss: float | None,
                                  more: dict) -> None:
    rec = P.parse(line, "stdout")
    assert rec is not None and rec.fmt == "generic", line
    assert any(k in line for k in METRIC_KEYWORDS), "the prefilter would drop it"
    assert rec.step == step

    def same(a: float | None, b: float | None) -> bool:
        return a == b or (a is not None and b is not None and math.isnan(a) and math.isnan(b))

    assert same(rec.loss, loss) and same(rec.val_loss, val_loss), rec
    for k, v in more.items():
        got = getattr(rec, k)
        if k == "extra":
            assert {n: got[n] for n in v} == v, got
        else:
            assert got == v, (k, rec)


PROSE = [
    "skipping NaN loss check",
    "Resuming from step: 100 (loss will be logged)",
    "the loss is going down, step 3 looks fine",
    "epoch 3 loss 2.5 took 30 s",
    "loss_scale: 65536 | step 3",  # fp16's loss scale is no loss
    "config: loss=cross_entropy, lr=0.1",
    "check for NaN losses enabled",
    "nan_to_num applied to the logits (loss stays finite)",
    "NaN guard: on",
    "2026-12-03 21:06:25,513 INFO trainer: saving checkpoint at iter 60 (loss 2.3)",
    "{'train_runtime': 4.0, 'train_loss': nan, 'epoch': 1.0}",  # HF's summary: the dict parsers decided
    "Epoch 3 training loss=2.1 was the best so far",
]


@pytest.mark.parametrize("line", PROSE)
def test_prose_is_not_a_record(line: str) -> None:
    assert P.parse(line, "stdout") is None
    assert parse_generic(line) is None


def test_a_logging_prefix_is_dropped_but_a_leading_metric_is_not_taken_for_a_logger_name() -> None:
    assert strip_prefix("2026-12-03 21:06:25,513 INFO trainer: epoch 0") == "epoch 0"
    assert strip_prefix("INFO:root:loss=1") == "loss=1"
    assert strip_prefix("INFO loss: 2.3") == "loss: 2.3"
    assert strip_prefix("[2026-12-03 21:06:25] WARNING step 3") == "step 3"
    assert strip_prefix("epoch 0 | loss 1") == "epoch 0 | loss 1"


# ------------------------------------------------------------------------- NaN from prose

REAL_NAN_SIGNS = [  # non-finite values in metric fields
    "train loss = nan",
    " iteration      500/  500000 | lm loss: 7.1E+00 | number of nan iterations:   3 |",
    "2026-12-03 21:06:25,513 INFO trainer: epoch 0 | iter 60/300 | train_loss=nan | lr=0.05",
    "step 25 loss nan µs/tok",
    "step 25 | loss nan | 3.1 µs/tok ✓",
]
NAN_MENTIONS = [  # words about NaN, no value: a warning (nan_mentioned), never a detection
    "RuntimeError: Loss is NaN, stopping training",
    "ValueError: loss is nan at step 12",
    "WARNING: NaN loss detected at step 58, skipping batch",
    "Detected NaN in the gradients",
    "Skipped batch 12 for NaN loss",
]
PROSE_NAN = [
    "skipping NaN loss check",
    "INFO: skipping NaN loss check for the first 100 steps",
    "nan_to_num enabled for the logits",
    "check for NaN losses enabled",
    "NaN guard: on",
    "NaN loss detection: on",
    "we stop if loss is nan",
    "checking whether the loss = nan every 10 steps",
    "no NaN detected in 300 steps",
    " iteration      500/  500000 | lm loss: 7.1E+00 | number of nan iterations:   0 |",
]


@pytest.mark.parametrize("line", REAL_NAN_SIGNS)
def test_real_nan_signs_fire(line: str) -> None:
    w, dets, _ = watch()
    w.feed("stdout", ["step 1 | loss 2.0", line, "noise"])
    assert [d.cause for d in dets] == [Cause.NAN], line


@pytest.mark.parametrize("line", PROSE_NAN)
def test_nan_named_in_prose_does_not_fire(line: str) -> None:
    w, dets, _ = watch()
    w.feed("stdout", ["step 1 | loss 2.0", line, "noise"])
    assert dets == [], (line, dets)


@pytest.mark.parametrize("line", NAN_MENTIONS)
def test_nan_mentioned_in_words_is_a_warning_not_a_detection(line: str) -> None:
    w, dets, _ = watch()
    w.feed("stdout", ["step 1 | loss 2.0", line, "noise"])
    assert dets == [], (line, dets)
    assert [n.event for n in w.take_notices()] == ["nan_mentioned"]


# ------------------------------------------------------------------------- onsets

def test_generic_nan_is_detected_at_its_step_with_the_onset_after_the_last_finite_print() -> None:
    w, dets, recs = watch()
    pre = "2026-12-03 21:06:25,513 INFO trainer: "
    w.feed("stderr", [f"{pre}epoch 0 | iter {s}/300 | train_loss={2.0 - s / 1000:.4f} | lr=0.05"
                      for s in range(10, 60, 10)])
    assert not dets and [r.step for r in recs] == [10, 20, 30, 40, 50]
    w.feed("stderr", [f"{pre}epoch 0 | iter 60/300 | train_loss=nan | lr=0.05"])
    [d] = dets
    assert d.cause is Cause.NAN and d.step == 60 and d.onset_step == 51


def bar(n: int, loss: str, desc: str = "train") -> str:
    return f"{desc}: {n * 100 // 300:3d}%|##        | {n}/300 [00:01<00:05, 45.2it/s, loss={loss}]"


def test_a_described_tqdm_bar_gives_the_onset_at_its_position_not_the_last_printed_step() -> None:
    w, dets, recs = watch()
    # The loop also prints a step line every 50 steps (on stdout); the bar (stderr) is redrawn at 55 and 58.
    w.feed("stdout", ["step 50 | loss 1.95"])
    w.feed("stderr", [bar(52, "1.950"), bar(55, "1.948")])
    w.feed("stderr", [bar(58, "nan")])
    [d] = dets
    assert d.step == 58 and d.onset_step == 56, d
    assert [r.step for r in recs if r.fmt == "tqdm"] == [52, 55, 58]


def test_a_bar_named_after_an_epoch_or_an_evaluation_counts_batches_and_stays_stepless() -> None:
    for desc in ("Epoch 3", "epoch 3/10", "Training epoch 2", "eval", "Validation", "val", "Evaluating", "test"):
        rec = P.parse(bar(58, "nan", desc), "stderr")
        assert rec is not None and rec.step is None and rec.extra["batch"] == 58.0, desc
    for desc in ("train", "Training", "steps", "pretrain"):
        rec = P.parse(bar(58, "nan", desc), "stderr")
        assert rec is not None and rec.step == 58, desc


def test_a_loop_bar_that_counts_from_zero_after_a_resume_is_shifted_by_the_resume_step() -> None:
    # tqdm(range(start, 300)) without initial=start: after resuming at 50 the bar reads 8/250 at step 58.
    w, dets, recs = watch()
    w.reset(0, None)
    w.feed("stderr", [bar(40, "1.5"), bar(60, "1.4")])
    assert [r.step for r in recs] == [40, 60]
    w.reset(1, 50)
    w.feed("stderr", [f"train:   3%|          | {n}/250 [00:01<00:05, 45.2it/s, loss={loss}]"
                      for n, loss in ((4, "1.45"), (8, "nan"))])
    assert [r.step for r in recs[2:]] == [54, 58] and recs[-1].extra["step_offset"] == 50.0
    [d] = dets
    assert d.step == 58 and d.onset_step == 55
    w.reset(2, 50)  # a bar built with initial=start shows the whole run: no shift
    w.feed("stderr", [bar(58, "1.3")])
    assert recs[-1].step == 58 and "step_offset" not in recs[-1].extra


# ------------------------------------------------------------------------- fields then words (issue 34 D1)

# line -> (step, loss, grad_norm): the leading fields name the step and a loss-like value; what follows is not read.
FIELDS_THEN_WORDS = [
    ("step 25 loss nan ok", 25, math.nan, None),
    ("step=25 loss=nan phase=train", 25, math.nan, None),
    ("step=25 phase=train loss=nan device=cuda:0", 25, math.nan, None),  # a setting (k=word) is skipped
    ("step: 25 | loss: nan | grad_norm: 1.2 | done", 25, math.nan, 1.2),
    ("step 25 loss tensor(nan)", 25, math.nan, None),
    ("step 25 | loss tensor(2.31, device='cuda:0', grad_fn=<AddBackward0>) | grad_norm tensor([inf])", 25, 2.31,
     math.inf),
    ("it 25 loss np.float64(2.5) saving", 25, 2.5, None),
    ("[25/300] loss nan done", 25, math.nan, None),
    ("step 25 train.loss=nan then words", 25, math.nan, None),
    ("step 25 loss nan, skipping batch", 25, math.nan, None),  # a value in a field: the words do not undo it
    ("step 25 | loss 2.31 | nan_check ok", 25, 2.31, None),
    ("step 25 loss 2.31 (no NaN)", 25, 2.31, None),  # the NaN is after the first word: not read
]


def same(a: float | None, b: float | None) -> bool:
    return a == b or (a is not None and b is not None and math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize("line,step,loss,grad_norm", FIELDS_THEN_WORDS)
def test_the_leading_fields_of_a_line_are_read_whatever_follows_them(line: str, step: int, loss: float,
                                                                     grad_norm: float | None) -> None:
    rec = parse_generic(line)
    assert rec is not None and rec.fmt == "generic", line
    assert rec.step == step and same(rec.loss, loss) and same(rec.grad_norm, grad_norm), rec
    via = P.parse(line, "stdout")  # and through the whole parser (kv, torchtitan, ... tried first)
    assert via is not None and via.step == step and same(via.loss, loss), via


@pytest.mark.parametrize("line", [
    "epoch 3 loss nan took 30 s",  # fields then words without a step: prose
    "loss nan ok",
    "skipping step 25 because loss is nan",  # a real NaN said in words: no field, no value
    "step 25: loss nan check passed",  # "nan check": a noun phrase
    "step 25 loss nan count 0",
    "step 25 loss inf guard: on",
    "step 25 loss nanmean 2.31",  # nan running on into letters is a word, not a NaN with a unit
    "step 25 loss infs 0",
    "loss=nan? yes, step 25",  # a question: "nan?" ends the fields before anything is read
])
def test_words_that_leave_no_step_and_loss_value_yield_no_nan(line: str) -> None:
    rec = P.parse(line, "stdout")
    assert rec is None or not (rec.loss is not None and math.isnan(rec.loss)), (line, rec)
    w, dets, _ = watch()
    w.feed("stdout", ["step 24 | loss 2.0", line, "step 26 | loss 1.9"])
    assert dets == [], (line, dets)


def test_a_nan_value_joined_by_a_sign_is_a_value_even_before_a_noun() -> None:
    # "loss=nan check": the sign assigns; only "loss nan check" (a space) reads as a noun phrase.
    for line in ("step 25 loss=nan check", "step 25 loss: nan check", "step 25 | loss nan | check passed"):
        rec = P.parse(line, "stdout")
        assert rec is not None and rec.step == 25 and math.isnan(rec.loss or 0.0), line
    rec = P.parse("step 25 loss 2.31 check passed", "stdout")  # a finite value is a value
    assert rec is not None and rec.loss == 2.31


def test_a_nan_with_words_after_it_is_detected_at_its_step_through_the_watcher() -> None:
    w, dets, _ = watch()
    w.feed("stdout", [f"step {s} loss 2.0" for s in range(1, 25)] + ["step 25 loss nan ok"])
    [d] = dets
    assert d.cause is Cause.NAN and d.step == 25 and d.details["field"] == "loss"
    assert w.take_notices() == []
