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
