"""Metric line parsers: a corpus per format (as each tool prints it) and near-misses that must not parse."""
from __future__ import annotations

import math

import pytest

from supervisor.watch.parsers import METRIC_KEYWORDS, MetricParser, parse_number

P = MetricParser()

# (line, fmt, step, loss, extra checks)
CORPUS = [
    # JSON lines
    ('{"step": 10, "loss": 2.3, "grad_norm": 1.1, "lr": 0.0003}', "json", 10, 2.3, {"grad_norm": 1.1, "lr": 3e-4}),
    ('{"iter": 7, "train_loss": 3.5, "tokens_per_sec": 12000}', "json", 7, 3.5, {"tokens_per_sec": 12000.0}),
    ('{"global_step": 5, "loss": NaN}', "json", 5, math.nan, {}),
    ('{"step": 6, "loss": Infinity, "grad_norm": -Infinity}', "json", 6, math.inf, {"grad_norm": -math.inf}),
    ('{"step": 8, "loss": "nan"}', "json", 8, math.nan, {}),
    ('{"step": 100, "val_loss": 2.9}', "json", 100, None, {"val_loss": 2.9}),
    ('{"train/global_step": 12, "train/loss": 4.25, "mem_gb": 31.5}', "json", 12, 4.25, {"extra": {"mem_gb": 31.5}}),
    ('[rank3]: {"step": 9, "loss": 2.0}', "json", 9, 2.0, {"rank": 3}),
    # HF Trainer
    ("{'loss': 2.31, 'grad_norm': 1.1, 'learning_rate': 5e-05, 'epoch': 0.1}", "hf", None, 2.31,
     {"grad_norm": 1.1, "lr": 5e-05, "extra": {"epoch": 0.1}}),
    ("{'eval_loss': 2.05, 'eval_runtime': 3.2, 'eval_samples_per_second': 120.5, 'epoch': 1.0}", "hf", None, None,
     {"val_loss": 2.05}),
    ("{'loss': nan, 'grad_norm': nan, 'learning_rate': 4.9e-05, 'epoch': 0.2}", "hf", None, math.nan, {}),
    ("{'loss': 0.0, 'grad_norm': inf, 'learning_rate': 1e-05, 'epoch': 2.0}", "hf", None, 0.0, {"grad_norm": math.inf}),
    ("{'loss': 1.5, 'grad_norm': tensor(0.83), 'learning_rate': 2e-05, 'epoch': 0.5}", "hf", None, 1.5,
     {"grad_norm": 0.83}),
    # nanoGPT
    ("iter 100: loss 2.3456, time 12.34ms, mfu 1.20%", "nanogpt", 100, 2.3456, {"extra": {"time_ms": 12.34, "mfu": 1.2}}),
    ("iter 0: loss 10.9876, time 4521.10ms, mfu -100.00%", "nanogpt", 0, 10.9876, {}),
    ("iter 510: loss nan, time 12.00ms, mfu 1.21%", "nanogpt", 510, math.nan, {}),
    ("step 250: train loss 2.0123, val loss 2.1045", "nanogpt", 250, 2.0123, {"val_loss": 2.1045}),
    # torchtitan (with and without colour, with the logger prefix)
    ("\x1b[31mstep:  1  \x1b[32mloss: 12.2345  \x1b[33mmemory: 30.12GiB(38.02%)  \x1b[34mtps: 1,234  "
     "\x1b[35mtflops: 55.1  \x1b[35mmfu: 12.34%\x1b[39m", "torchtitan", 1, 12.2345, {"tokens_per_sec": 1234.0}),
    ("[rank0]:[titan] 2025-03-01 10:00:00,123 - root - INFO - step: 10  loss:  7.9123  grad_norm:  1.2345  "
     "memory: 30.12GiB(38.02%)  tps: 5,678  tflops: 60.2  mfu: 14.1%", "torchtitan", 10, 7.9123,
     {"grad_norm": 1.2345, "tokens_per_sec": 5678.0, "rank": 0}),
    ("step: 20  loss:    nan  memory: 30.12GiB(38.02%)  tps: 5,678", "torchtitan", 20, math.nan, {}),
    # Megatron-LM
    (" iteration      100/  500000 | consumed samples:        51200 | elapsed time per iteration (ms): 1234.5 | "
     "learning rate: 1.500E-04 | global batch size:   512 | lm loss: 7.300E+00 | loss scale: 1.0 | "
     "grad norm: 2.103 | number of skipped iterations:   0 | number of nan iterations:   0 |", "megatron", 100, 7.3,
     {"grad_norm": 2.103, "lr": 1.5e-4, "extra": {"number of nan iterations": 0.0}}),
    ("[2024-05-01 12:00:00] iteration      500/  500000 | consumed samples:       256000 | lm loss: NAN | "
     "grad norm: nan | number of skipped iterations:   0 | number of nan iterations:   1 |", "megatron", 500,
     math.nan, {}),
    (" validation loss at iteration 1000 | lm loss value: 6.912345E+00 | lm loss PPL: 1.004E+03 | ", "megatron",
     1000, None, {"val_loss": 6.912345}),
]

NEAR_MISSES = [
    "",
    "loss",
    "Training loss went down nicely",
    '{"lr": 0.001, "batch_size": 32}',  # a config dump: no loss-like metric
    '{"step": 10, "loss": null}',
    '{"step": 10, "loss": "low"}',
    "{'train_runtime': 123.4, 'train_samples_per_second': 5.6, 'train_loss': 2.1, 'epoch': 3.0}",  # HF summary
    "{'model_type': 'gpt2', 'n_layer': 12}",
    "{'loss': 'high', 'epoch': 1}",
    "{not json at all, 'loss': 1}",
    "iter 100 loss 2.3",  # no colon
    "iteration 100: loss 2.3",
    "iter abc: loss 2.3",
    "iter 100: loss high, time 1ms",
    "step 250: train loss 2.0",  # eval line without the val part
    "Resuming from step: 100 (loss will be logged)",
    "step: 10 memory: 30GiB",  # torchtitan without a loss
    "step: x  loss: 2.3",
    " iteration 100 | lm loss: 7.3 |",  # no /total
    "Saving checkpoint at iteration 1000 to /ckpt",
    "[rank0]: Traceback (most recent call last):",
    "Epoch 3: 45%|#####     | 4500/10000 [12:34<15:20, 5.97it/s, loss=2.31]",
]


@pytest.mark.parametrize("line,fmt,step,loss,checks", CORPUS, ids=[f"{c[1]}-{i}" for i, c in enumerate(CORPUS)])
def test_corpus_parses(line: str, fmt: str, step: int | None, loss: float | None, checks: dict) -> None:
    rec = P.parse(line, "stdout")
    assert rec is not None, line
    assert rec.fmt == fmt
    assert rec.step == step
    assert rec.source == "stdout"
    if loss is None:
        assert rec.loss is None
    elif math.isnan(loss):
        assert rec.loss is not None and math.isnan(rec.loss)
    else:
        assert rec.loss == pytest.approx(loss)
    for key, want in checks.items():
        got = getattr(rec, key)
        if key == "extra":
            for k, v in want.items():
                assert got[k] == pytest.approx(v)
        else:
            assert got == pytest.approx(want)
    # The prefilter never hides a metric line.
    assert any(k in line for k in METRIC_KEYWORDS)


@pytest.mark.parametrize("line", NEAR_MISSES)
def test_near_misses_do_not_parse(line: str) -> None:
    assert P.parse(line) is None


@pytest.mark.parametrize("text,want", [
    ("nan", math.nan), ("NaN", math.nan), ("-nan", math.nan), ("NAN", math.nan),
    ("inf", math.inf), ("-inf", -math.inf), ("Infinity", math.inf), ("-Infinity", -math.inf), ("INF", math.inf),
    ("1,234", 1234.0), ("7.300E+00", 7.3), ("12.5%", 12.5), (" 3 ", 3.0),
])
def test_number_spellings(text: str, want: float) -> None:
    got = parse_number(text)
    assert got is not None
    assert (math.isnan(got) and math.isnan(want)) or got == want


@pytest.mark.parametrize("text", ["", "abc", "1.2.3", "--1", "nanx"])
def test_number_rejects(text: str) -> None:
    assert parse_number(text) is None


def test_user_regex_named_groups() -> None:
    p = MetricParser([r"^\| step (?P<step>\d+) \| loss (?P<loss>\S+) \| ppl (?P<ppl>\S+)"])
    rec = p.parse("| step 42 | loss 3.25 | ppl 25.8")
    assert rec is not None and rec.fmt == "regex"
    assert (rec.step, rec.loss, rec.extra["ppl"]) == (42, 3.25, 25.8)
    rec = p.parse("| step 43 | loss -inf | ppl 1")
    assert rec is not None and rec.loss == -math.inf
    assert p.parse("| step 42 | nothing here") is None


def test_auto_off_uses_only_user_regexes() -> None:
    p = MetricParser([r"L=(?P<loss>\S+)"], auto=False)
    assert p.parse("iter 100: loss 2.3456, time 12.34ms, mfu 1.20%") is None
    rec = p.parse("L=2.5")
    assert rec is not None and rec.loss == 2.5 and rec.step is None


def test_overlong_line_is_not_parsed() -> None:
    p = MetricParser(max_line_chars=100)
    assert p.parse('{"step": 1, "loss": 2.0, "pad": "' + "x" * 200 + '"}') is None
