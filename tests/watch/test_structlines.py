"""Structured log lines (loguru serialize=True, structlog's JSON renderer, python-json-logger) whose
metrics are in the message text: the parser reads the message as an ordinary line, one level deep."""

from __future__ import annotations

import json
import math
import subprocess
import sys

from supervisor.watch.parsers import MetricParser
from supervisor.watch.structlines import json_message, message_of


def test_real_loguru_json_lines_give_their_message_metrics() -> None:
    # loguru's own serializer, not a hand-written imitation of it.
    job = ("import sys; from loguru import logger; logger.remove(); logger.add(sys.stdout, serialize=True); "
           "logger.info('step 10 loss=nan lr=0.1'); logger.info('step 11 | loss: 2.31'); logger.info('saving')")
    out = subprocess.run([sys.executable, "-c", job], check=True, capture_output=True, text=True, timeout=60).stdout
    lines = out.splitlines()
    assert len(lines) == 3 and all(json.loads(x)["record"]["message"] for x in lines)
    p = MetricParser()
    first, second, third = (p.parse(x, "stdout") for x in lines)
    assert first is not None and first.step == 10 and math.isnan(first.loss or 0.0) and first.lr == 0.1
    assert second is not None and second.step == 11 and second.loss == 2.31
    assert third is None


def test_structlog_and_json_logger_messages_and_what_is_not_unwrapped() -> None:
    p = MetricParser()
    rec = p.parse(json.dumps({"event": "epoch 1, step 60, loss: nan", "level": "info"}), "stdout")
    assert rec is not None and rec.step == 60 and math.isnan(rec.loss or 0.0)
    rec = p.parse(json.dumps({"message": "it 5 train/loss=1.5", "levelname": "INFO"}), "stdout")
    assert rec is not None and rec.loss == 1.5
    # A record with its own metric keys keeps them (the message is not read).
    rec = p.parse(json.dumps({"event": "step 1 loss=nan", "step": 2, "loss": 3.0}), "stdout")
    assert rec is not None and rec.step == 2 and rec.loss == 3.0
    # A message that is itself JSON is not unwrapped again; deep nesting is no crash.
    assert json_message(json.dumps({"message": json.dumps({"message": "step 1 loss=nan"})})) is None
    assert json_message("{" * 100_000) is None
    assert json_message('["step 1 loss=nan"]') is None
    assert message_of({"record": {"message": " "}, "msg": "x"}) == "x"


def test_real_loguru_message_with_fields_then_a_setting_is_the_nan() -> None:
    # issue 34 D1: "step=25 loss=nan phase=train" was prose ("phase=train" is no number), so a loguru
    # serialize=True job's NaN left the run "finished, unwatched".
    job = ("import sys; from loguru import logger; logger.remove(); logger.add(sys.stdout, serialize=True); "
           "logger.info('step=25 loss=nan phase=train'); logger.info('step: 26 | loss: nan | grad_norm: 1.2 | done')")
    out = subprocess.run([sys.executable, "-c", job], check=True, capture_output=True, text=True, timeout=60).stdout
    p = MetricParser()
    recs = [p.parse(x, "stdout") for x in out.splitlines()]
    assert [(r.step, math.isnan(r.loss or 0.0)) for r in recs if r is not None] == [(25, True), (26, True)], out


def test_nested_json_is_read_one_level_deep() -> None:
    p = MetricParser()
    rec = p.parse('{"step":25,"train":{"loss":NaN}}', "stdout")
    assert rec is not None and rec.fmt == "json" and rec.step == 25 and math.isnan(rec.loss or 0.0)
    # eval.loss / eval/loss is an eval metric, never the training loss; a top-level loss wins over a nested one.
    rec = p.parse('{"step": 25, "loss": 2.0, "eval": {"loss": NaN}, "train": {"loss": 9.0}}', "stdout")
    assert rec is not None and rec.loss == 2.0 and math.isnan(rec.val_loss or 0.0)
    rec = p.parse('{"step": 25, "train.loss": 2.5, "eval.loss": NaN}', "stdout")
    assert rec is not None and rec.loss == 2.5 and math.isnan(rec.val_loss or 0.0)
    rec = p.parse('{"step": 25, "training": {"grad_norm": Infinity, "loss": 2.1}, "eval": {"accuracy": NaN}}',
                  "stdout")
    assert rec is not None and rec.grad_norm == math.inf and rec.loss == 2.1 and math.isnan(rec.extra["eval/accuracy"])
    # Two levels down is not read: no loss at all here, so no record.
    assert p.parse('{"step": 25, "a": {"train": {"loss": NaN}}}', "stdout") is None
    # A nested object with no metric in it (a structured logger's record) gives no record of its own.
    assert p.parse('{"record": {"line": 5, "level": {"no": 20}}, "step": 3}', "stdout") is None


def test_path_keys_name_their_field() -> None:
    from supervisor.watch.records import field_of

    assert [field_of(k) for k in ("train.loss", "train/loss", "Training/Grad_Norm", "eval.loss", "val.loss",
                                  "model.loss", "train.eval_loss", "a.b.loss", "loss")] == [
        "loss", "loss", "grad_norm", "val_loss", "val_loss", None, "val_loss", None, "loss"]
