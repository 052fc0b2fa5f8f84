"""Issue 34 D1, round 4: a trailing dict or sentence punctuation after a line's fields no longer sends
the line away from the field reader; bracketed steps, ``loss/train`` keys, ``{"metrics": {...}}`` and
loguru's ``logger.bind(loss=...)`` are read."""
from __future__ import annotations

import json
import math
import subprocess
import sys

from supervisor.events import Cause
from supervisor.core.observations import Detection, MetricRecord
from supervisor.watch.config import DetectorsConfig
from supervisor.watch.generic import MAX_DICT_CHARS, trailing_dict
from supervisor.watch.logwatch import LogWatcher
from supervisor.watch.parsers import MetricParser
from supervisor.watch.records import field_of


def test_the_testers_lines_are_records() -> None:
    p = MetricParser()
    rec = p.parse("step 4 loss nan {'lr': 0.1}")
    assert rec is not None and rec.step == 4 and math.isnan(rec.loss or 0.0) and rec.lr == 0.1
    rec = p.parse("step 25 loss 0.5.")
    assert rec is not None and (rec.step, rec.loss) == (25, 0.5)
    rec = p.parse("step 25 loss nan. Check passed")  # the period ends the value: no "nan check" noun phrase
    assert rec is not None and math.isnan(rec.loss or 0.0)
    assert p.parse("step 25 loss nan check passed") is None


def test_a_trailing_dict_is_read_when_it_parses_and_is_words_when_not() -> None:
    p = MetricParser()
    rec = p.parse("step 4 {'loss': tensor(-inf, device='cuda:0'), 'grad_norm': np.float64(1.5)}")
    assert rec is not None and rec.step == 4 and rec.loss == -math.inf and rec.grad_norm == 1.5
    rec = p.parse('step 4 loss 2.0 {"metrics": {"grad_norm": Infinity}, "eval": {"loss": NaN}}')
    assert rec is not None and rec.loss == 2.0 and rec.grad_norm == math.inf and math.isnan(rec.val_loss or 0.0)
    rec = p.parse("step 4 loss 2.0 {'loss': nan}")  # the line's own field wins
    assert rec is not None and rec.loss == 2.0
    # HF's train summary after a step is no step's loss; a dict two levels down is not read.
    assert p.parse("step 4 {'train_runtime': 3.0, 'train_loss': 2.0}") is None
    assert p.parse("step 4 {'a': {'b': {'loss': nan}}}") is None
    # Not a dict: words after the fields (a record only with its step).
    rec = p.parse("step 4 loss nan {oops")
    assert rec is not None and math.isnan(rec.loss or 0.0)
    assert p.parse("loss nan {oops}") is None
    assert trailing_dict("{'a': __import__('os').system('x')}") == {}  # parsed, never evaluated
    assert trailing_dict("{" * 300 + "}" * 300) is None
    assert trailing_dict("{'loss': nan, " + "'a': 1, " * MAX_DICT_CHARS + "}") is None  # past the bound: words


def test_brackets_slash_suffixes_and_nested_metrics() -> None:
    p = MetricParser()
    for line in ("[step 25] loss=nan", "[Step 25/300] loss: nan", "step 25 loss/train nan",
                 '{"step": 25, "metrics": {"loss": NaN}}'):
        rec = p.parse(line)
        assert rec is not None and rec.step == 25 and math.isnan(rec.loss or 0.0), line
    assert [field_of(k) for k in ("Loss/train", "loss/val", "metrics/loss", "metrics.grad_norm", "lr/train",
                                  "acc/train", "a/loss/train", "model/loss")] == [
        "loss", "val_loss", "loss", "grad_norm", "lr", None, None, None]


def _watch() -> tuple[LogWatcher, list[Detection], list[MetricRecord]]:
    dets: list[Detection] = []
    recs: list[MetricRecord] = []
    w = LogWatcher(DetectorsConfig(), dets.append, recs.append)
    w.reset(0, None)
    return w, dets, recs


def test_a_real_job_printing_a_dict_after_its_fields_is_rolled_back_at_its_nan() -> None:
    job = "for s in range(1, 30):\n    print(f\"step {s} loss {'nan' if s >= 25 else 1 / s} {{'lr': 0.001}}\")\n"
    out = subprocess.run([sys.executable, "-c", job], check=True, capture_output=True, text=True, timeout=60).stdout
    w, dets, recs = _watch()
    w.feed("stdout", out.splitlines())
    assert [(d.cause, d.step) for d in dets][:1] == [(Cause.NAN, 25)], dets
    assert recs[0].step == 1 and recs[0].lr == 0.001


def test_real_loguru_bind_metrics_are_read_with_the_messages_step() -> None:
    job = ("import sys; from loguru import logger; logger.remove(); logger.add(sys.stdout, serialize=True); "
           "logger.bind(loss=2.0).info('step 24'); logger.bind(loss=float('nan')).info('step 25'); "
           "logger.info('step {}', 26, loss=float('inf')); logger.bind(user='x').info('step 27 loss=1.5'); "
           "logger.bind(user='x').info('saving')")
    out = subprocess.run([sys.executable, "-c", job], check=True, capture_output=True, text=True, timeout=60).stdout
    lines = out.splitlines()
    assert len(lines) == 5 and math.isnan(json.loads(lines[1])["record"]["extra"]["loss"])
    p = MetricParser()
    recs = [p.parse(x, "stdout") for x in lines]
    assert [(r.step, r.loss) for r in recs[:1] if r] == [(24, 2.0)]
    assert recs[1] is not None and recs[1].step == 25 and math.isnan(recs[1].loss or 0.0)
    assert recs[2] is not None and (recs[2].step, recs[2].loss) == (26, math.inf)
    assert recs[3] is not None and (recs[3].step, recs[3].loss) == (27, 1.5)
    assert recs[4] is None
    w, dets, _ = _watch()
    w.feed("stdout", lines)
    assert [(d.cause, d.step) for d in dets][:1] == [(Cause.NAN, 25)]
