"""A NaN is a value, never a word (issue 34 part 2), and an eval metric is not the training loss
(issue 35 part 5): the corpora of tests/corpus/nan/ through the real LogWatcher and detectors.

- ``prose.txt``: lines that speak of NaN/inf on a healthy run (zero-NaN counters, questions, AMP's
  loss scaler, skipping, recovering, torch anomaly mode, invalid UTF-8): never a detection, at most
  one ``nan_mentioned`` warning per run, also when the same line comes back at the same step after
  a restart.
- ``values.txt``: a non-finite value in a metric field with noise around it (a unit, a symbol, an
  emoji, invalid UTF-8, a second metric): always one ``nan`` detection at its step.
"""
from __future__ import annotations

import time
import math
import re
from pathlib import Path

import pytest

from supervisor.events import Cause
from supervisor.core.observations import Detection, MetricRecord
from supervisor.watch.config import DetectorsConfig, NanDetectorConfig
from supervisor.watch.logwatch import LogWatcher
from supervisor.watch.nannotes import is_eval_key

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "nan"


def lines_of(name: str) -> list[str]:
    """The corpus lines, decoded as the daemon decodes a job's output (UTF-8, invalid bytes replaced)."""
    raw = (CORPUS / name).read_bytes().split(b"\n")
    out = [r.decode("utf-8", "replace") for r in raw]
    return [x for x in out if x and not x.startswith("#")]


PROSE = lines_of("prose.txt")
VALUES = lines_of("values.txt")


def watch(cfg: DetectorsConfig | None = None) -> tuple[LogWatcher, list[Detection], list[MetricRecord]]:
    dets: list[Detection] = []
    recs: list[MetricRecord] = []
    w = LogWatcher(cfg or DetectorsConfig(), dets.append, recs.append)
    w.reset(0, None)
    return w, dets, recs


def test_the_corpora_are_there_and_hold_invalid_utf8() -> None:
    assert len(PROSE) >= 40 and len(VALUES) >= 18
    assert any("\ufffd" in x for x in PROSE) and any("\ufffd" in x for x in VALUES)


@pytest.mark.parametrize("line", PROSE)
def test_benign_prose_never_stops_a_job(line: str) -> None:
    w, dets, recs = watch()
    w.feed("stdout", ["step 24 | loss 2.10", line, "step 26 | loss 2.08"])
    assert dets == [], (line, dets)
    assert all(math.isfinite(r.loss) for r in recs if r.loss is not None), recs
    notices = w.take_notices()
    assert [n.event for n in notices] in ([], ["nan_mentioned"]), notices


def test_the_whole_prose_corpus_twice_at_the_same_steps_is_one_warning_and_no_detection() -> None:
    # Two attempts of a healthy run that prints every benign line at the same steps: the second is
    # what used to read as a deterministic NaN and gave up. No detection, one warning in all.
    w, dets, _ = watch()
    said = []
    for attempt in range(2):
        w.reset(attempt, None if attempt == 0 else 20)
        for i, line in enumerate(PROSE):
            w.feed("stderr", [f"step {20 + i} | loss {2.0 - i / 1000:.4f}", line])
        said += w.take_notices()
    assert dets == []
    [n] = said
    assert n.event == "nan_mentioned" and n.data["line"] == PROSE[0] and n.data["step"] == 20


@pytest.mark.parametrize("line", VALUES)
def test_a_nan_value_with_noise_after_it_always_stops(line: str) -> None:
    w, dets, _ = watch()
    w.feed("stdout", ["step 24 | loss 2.10", line])
    assert [d.cause for d in dets] == [Cause.NAN], line
    assert dets[0].step == 25, dets[0]
    assert w.take_notices() == []  # a value: no "mentioned" warning beside the detection


def test_a_mention_longer_than_the_evidence_bound_is_cut_and_masked() -> None:
    w, dets, _ = watch()
    line = "Loss is NaN? False; HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123 " + "x" * 1_000_000
    w.feed("stdout", ["step 1 | loss 2.0", line])
    [n] = w.take_notices()
    assert dets == [] and len(str(n.data["line"])) <= 300
    assert "hf_abcdefghijklmnopqrstuvwxyz0123" not in str(n.data["line"]) + n.message


# ------------------------------------------------------------------ eval metrics (issue 35 part 5)

EVAL_LINES = [
    ("step 50 | val_loss nan", "val_loss"),
    ("{'eval_loss': 'nan', 'eval_runtime': '0.0036', 'epoch': '0.6667'}", "val_loss"),
    ('{"step": 50, "loss": 2.1, "eval/accuracy": NaN}', "eval/accuracy"),  # judged beside a loss-like value
    ('{"step": 50, "validation/loss": NaN}', "val_loss"),
    ("step 50 | loss 2.1 | test_loss inf", "test_loss"),
    ("step 50: val loss nan", "val_loss"),
]


@pytest.mark.parametrize("line,field", EVAL_LINES)
def test_a_nonfinite_eval_metric_with_a_finite_training_loss_is_a_warning_not_a_rollback(line: str,
                                                                                         field: str) -> None:
    w, dets, _ = watch()
    w.feed("stdout", ["step 49 | loss 2.10", line, "step 51 | loss 2.09"])
    assert dets == [], (line, dets)
    [n] = w.take_notices()
    assert n.event == "eval_nonfinite" and n.level == "warning" and field in n.data["fields"], n
    assert "Not rolled back" in n.message and re.search(r"training loss is finite \(2.1 at step (49|50)\)", n.message)
    assert '"val_loss" to [detectors.nan] fields' in n.message


def test_eval_nonfinite_is_said_once_per_attempt_and_metric() -> None:
    w, dets, _ = watch()
    for s in range(10, 310, 10):  # every eval of a 300-step run: val_loss nan (an empty validation loader)
        w.feed("stdout", [f"step {s} | loss {3 - s / 1000:.3f}", f"step {s} | val_loss nan"])
    assert dets == [] and [n.event for n in w.take_notices()] == ["eval_nonfinite"]
    w.reset(1, 300)
    w.feed("stdout", ["step 310 | loss 2.6", "step 310 | val_loss nan"])
    assert [n.event for n in w.take_notices()] == ["eval_nonfinite"]


def test_naming_val_loss_in_the_fields_makes_it_a_rollback() -> None:
    w, dets, _ = watch(DetectorsConfig(nan=NanDetectorConfig(fields=("loss", "grad_norm", "val_loss"))))
    w.feed("stdout", ["step 49 | loss 2.10", "step 50 | val_loss nan"])
    [d] = dets
    assert d.cause is Cause.NAN and d.step == 50 and d.details["field"] == "val_loss"
    assert w.take_notices() == []


def test_a_nan_training_loss_beside_a_nan_eval_loss_is_the_training_rollback() -> None:
    w, dets, _ = watch()
    w.feed("stdout", ["step 249: train loss 2.0, val loss 2.1", "step 250: train loss nan, val loss nan"])
    assert [(d.cause, d.step, d.details["field"]) for d in dets] == [(Cause.NAN, 250, "loss")]
    assert w.take_notices() == []


@pytest.mark.parametrize("key,is_eval", [
    ("eval/accuracy", True), ("validation/loss", True), ("test_loss", True), ("val_ppl", True),
    ("metrics/val_loss", True), ("eval_runtime", True), ("train/loss", False), ("interval", False),
    ("lr", False), ("valuation", False), ("testing_loss", False), ("contest", False),
])
def test_eval_keys(key: str, is_eval: bool) -> None:
    assert is_eval_key(key) is is_eval


def test_ever_new_nan_eval_keys_are_said_a_bounded_number_of_times() -> None:
    from supervisor.watch.nannotes import MAX_EVAL_FIELDS, MAX_EVAL_NOTICES

    w, dets, _ = watch()
    keys = ", ".join(f'"eval/m{i}": NaN' for i in range(40))
    w.feed("stdout", [f'{{"step": {s}, "loss": 2.0, {keys.replace("/m", f"/s{s}m")}}}' for s in range(1, 1001)])
    notices = w.take_notices()
    assert dets == [] and len(notices) == MAX_EVAL_NOTICES
    assert all(len(n.data["fields"]) == MAX_EVAL_FIELDS for n in notices)
    assert "at most" in notices[-1].data["next"] and "at most" not in notices[0].data["next"]


def test_a_nonfinite_eval_scalar_in_a_metric_file_is_the_same_warning() -> None:
    # TensorBoard / CSV / JSONL records (metricfiles.py) take the same path as parsed lines.
    w, dets, _ = watch()
    w.feed_records("tb:/run/events.out.tfevents.1", [MetricRecord(step=49, loss=2.1, at=time.time()),
                                                      MetricRecord(step=50, val_loss=math.nan, at=time.time())])
    assert dets == []
    [n] = w.take_notices()
    assert n.event == "eval_nonfinite" and n.data["step"] == 50 and n.data["source"] == "tb:/run/events.out.tfevents.1"
    w.feed_records("tb:/run/events.out.tfevents.1", [MetricRecord(step=60, loss=math.inf, at=time.time())])
    assert [(d.cause, d.step) for d in dets] == [(Cause.NAN, 60)]  # the training loss: a rollback


def test_a_crafted_unit_chain_costs_linear_time() -> None:
    # "(?:(?:ms|[mun]?s)/)*" backtracked exponentially on "ms/ms/.../x" (3 s at 22 parts); the unit
    # words are a set now. 5,000 parts, past the 4,096-character line cap: far below a second.
    import time

    from supervisor.watch.generic import is_noise, parse_generic

    t = time.perf_counter()
    assert not is_noise("µ" + "ms/" * 5000 + "x") and is_noise("µ" + "ms/" * 5000)
    # A word after the fields ends them (issue 34 part 2, D1): the NaN before it is still the value.
    rec = parse_generic("step 1 loss nan µ" + "ms/" * 5000 + "x")
    assert rec is not None and rec.step == 1 and rec.loss is not None and math.isnan(rec.loss)
    assert time.perf_counter() - t < 1.0


# ------------------------------------------- control bytes after a value, quotes (issue 34, D2 and RISK)

# A control byte or escape sequence right after a NaN hid it (the run ended "finished" over a NaN):
# each is a separator for parsing, as a terminal shows none of them. As the job writes them.
CONTROL_NAN = [
    b"step 25 loss nan\x07", b"step 25 loss nan\x00", b"step 25 loss=nan\x01", b"step 25 loss=nan\x7f",
    b"step 25 loss nan\x1b]0;title\x07", b"step 25 loss nan\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\",
    b"step 25 loss=nan\x00\x00 more", b"step 25 loss=NaN\x00\x01", b"step 25 loss nan\x1b[K", b"step 25 loss nan\x1bc",
    b"step 25 loss nan\x1bP1$r0m\x1b\\", b"\x00step 25 loss nan", b"step 25\x0bloss\x0cnan", b"step 25 loss nan\xc2\x9b",
    b"step 25 loss 'nan'", b'step 25 loss "nan"', b"step 25 loss: '-inf'", b"step=25 loss='NaN' lr=1e-4",
]
# ... and the same bytes never make a finite line a NaN, nor a word a value.
CONTROL_BENIGN = [
    b"step 25 loss=1.9000\x00 ok nan", b"step 25 loss 1.9\x07 (no nan)", b"\x1b]0;nan\x07step 25 loss 1.9",
    b"step 25 loss '1.9' nan_count 0", b"loss is 'nan'? False", b"step 25 msg='nan' loss 1.9",
]


@pytest.mark.parametrize("raw", CONTROL_NAN, ids=repr)
def test_a_nan_value_before_a_control_byte_or_in_quotes_stops(raw: bytes) -> None:
    w, dets, _ = watch()
    line = raw.decode("utf-8", "replace")
    w.feed("stdout", ["step 24 | loss 2.10", line])
    assert [(d.cause, d.step) for d in dets] == [(Cause.NAN, 25)], line
    assert dets[0].onset_step == 25


@pytest.mark.parametrize("raw", CONTROL_BENIGN, ids=repr)
def test_control_bytes_and_quotes_never_make_prose_a_nan(raw: bytes) -> None:
    w, dets, recs = watch()
    w.feed("stdout", ["step 24 | loss 2.10", raw.decode("utf-8", "replace"), "step 26 | loss 2.08"])
    assert dets == [] and all(math.isfinite(r.loss) for r in recs if r.loss is not None), (raw, dets)


# ---------------------------------------------------------- fp16 overflow skips (issue 34, R1)

OVERFLOW = lines_of("overflow.txt")


@pytest.mark.parametrize("line", OVERFLOW)
def test_a_nonfinite_grad_norm_beside_a_finite_loss_is_a_warning_even_at_the_same_step_again(line: str) -> None:
    # AMP / DeepSpeed / HF print it on every skipped fp16 step: a rollback, then the same line at the
    # same step, gave up (exit 3) on a healthy run. Now a warning, and a second attempt is the same.
    w, dets, _ = watch()
    for attempt in range(2):
        w.reset(attempt, None if attempt == 0 else 20)
        w.feed("stdout", ["step 24 | loss 2.10", line, "step 26 | loss 2.08 | grad_norm 0.9"])
        assert dets == [], (line, dets)
        [n] = w.take_notices()
        assert n.event == "grad_overflow" and n.level == "warning" and n.data["overflows"] == 1, n
        assert "Not rolled back" in n.message and "overflow_steps" in n.message


@pytest.mark.parametrize("line", OVERFLOW)
def test_overflow_steps_1_rolls_back_on_any_nonfinite_grad_norm(line: str) -> None:
    w, dets, _ = watch(DetectorsConfig(nan=NanDetectorConfig(overflow_steps=1)))
    w.feed("stdout", ["step 24 | loss 2.10", line])
    [d] = dets
    assert d.cause is Cause.NAN and d.details["field"] == "grad_norm" and d.details["overflow"] is True


def test_overflow_steps_in_a_row_are_a_divergence_and_a_finite_grad_norm_ends_the_run() -> None:
    w, dets, _ = watch()
    k = NanDetectorConfig().overflow_steps
    w.feed("stdout", ["step 9 loss 2.0 grad_norm 1.0"])
    w.feed("stdout", [f"step {s} loss 1.9 grad_norm inf" for s in range(10, 10 + k - 1)])
    w.feed("stdout", ["step 40 loss 1.9 grad_norm 0.8", "step 41 loss 1.9 grad_norm 0.8"])  # the scaler recovered
    w.feed("stdout", [f"step {s} loss 1.9 grad_norm inf" for s in range(50, 50 + k - 1)])
    assert dets == []
    w.feed("stdout", [f"step {50 + k - 1} loss 1.9 grad_norm -inf", "step 99 loss nan"])
    [d] = dets
    assert d.cause is Cause.NAN and d.step == 50 + k - 1 and d.onset_step == 42 and d.details["consecutive"] == k
    # the notices: the 1st and the 10th skipped step of the attempt, with the count
    assert [n.data["overflows"] for n in w.take_notices()] == [1, 10]


def test_a_nonfinite_loss_still_fires_at_once_amid_overflow_skips() -> None:
    w, dets, _ = watch()
    w.feed("stdout", ["step 9 loss 2.0 grad_norm 1.0", "step 10 loss 1.9 grad_norm inf", "step 11 loss nan grad_norm inf"])
    [d] = dets
    assert d.cause is Cause.NAN and d.step == 11 and d.details["field"] == "loss" and d.onset_step == 10


def test_a_nan_grad_norm_with_no_loss_scale_beside_it_fires_at_once() -> None:
    # HF's default logging_nan_inf_filter prints a diverged run as a finite loss and 'grad_norm': nan
    # (tests/corpus/hf5_filter_on): no scaler in sight, so no overflow skip: a rollback at once.
    w, dets, _ = watch()
    w.feed("stdout", ["{'loss': 3.9, 'grad_norm': 1.5, 'learning_rate': 4e-05, 'epoch': 0.3}",
                      "step 24 | loss 2.10", "step 25 | loss 3.1 | grad_norm nan"])
    [d] = dets
    assert d.cause is Cause.NAN and d.step == 25 and d.details["field"] == "grad_norm" and "overflow" not in d.details
    assert [n.event for n in w.take_notices()] == []
