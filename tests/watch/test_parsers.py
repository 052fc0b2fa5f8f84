"""Metric line parsers: a corpus per format (as each tool prints it) and near-misses that must not parse."""
from __future__ import annotations

import math

import pytest

from supervisor.watch.records import parse_human, parse_number
from supervisor.watch.parsers import METRIC_KEYWORDS, MetricParser

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
    # HF Trainer 5.x (quoted values), behind a logging prefix, behind a bar's \r, eval NaN
    ("{'loss': '4.038', 'grad_norm': '0.7147', 'learning_rate': '4.333e-05', 'epoch': '0.1562'}", "hf", None, 4.038,
     {"grad_norm": 0.7147, "lr": 4.333e-05, "extra": {"epoch": 0.1562}}),
    ("{'loss': 'nan', 'grad_norm': 'nan', 'learning_rate': '1e-05', 'epoch': '1'}", "hf", None, math.nan, {}),
    ("{'loss': '0', 'grad_norm': '-inf', 'learning_rate': '1e-05', 'epoch': '1'}", "hf", None, 0.0,
     {"grad_norm": -math.inf}),
    ("{'eval_loss': 'nan', 'eval_runtime': '0.0036', 'eval_samples_per_second': '2200', 'epoch': '0.6667'}", "hf",
     None, None, {"extra": {"eval_runtime": 0.0036}}),
    ("12/02/2026 18:14:33 - INFO - __main__ - {'loss': 3.9025, 'grad_norm': nan, 'learning_rate': 4.3e-05, "
     "'epoch': 0.17}", "hf", None, 3.9025, {"lr": 4.3e-05}),
    ("\r 17%|█▋        | 5/30 [00:00<00:00, 49.08it/s]\r                \r{'loss': '3.9', 'epoch': '0.17'}", "hf",
     None, 3.9, {}),
    ("{'loss': 1.5, 'grad_norm': np.float64(0.83), 'learning_rate': 2e-05, 'epoch': 0.5}", "hf", None, 1.5,
     {"grad_norm": 0.83}),
    ('2025-01-01 12:00:00 INFO metrics: {"step": 3, "loss": 2.5}', "json", 3, 2.5, {}),
    # tqdm training bar: progress records
    (" 17%|█▋        | 5/30 [00:00<00:00, 49.08it/s]", "progress", 5, None, {"extra": {"total": 30.0}}),
    ("100%|██████████| 30/30 [00:01<00:00, 20.10it/s]", "progress", 30, None, {"extra": {"total": 30.0}}),
    ("  0%|          | 0/30 [00:00<?, ?it/s][transformers] `loss_type=None` was set in the config", "progress", 0,
     None, {"extra": {"total": 30.0}}),
    ("[rank0]: 45%|####5     | 45/100 [01:02<01:16,  1.39s/it]", "progress", 45, None, {"rank": 0}),
    # PyTorch Lightning bar postfix; a hand-written loop's tqdm postfix
    ("Epoch 0:  40%|████      | 20/50 [00:01<00:02, 14.5it/s, v_num=0, train_loss=2.310]", "lightning", None, 2.31,
     {"extra": {"epoch": 0.0, "batch": 20.0, "total": 50.0}}),
    ("Epoch 3: 45%|#####     | 4500/10000 [12:34<15:20, 5.97it/s, loss=2.31]", "lightning", None, 2.31,
     {"extra": {"epoch": 3.0, "batch": 4500.0}}),
    ("Epoch 1:  80%|████████  | 8/10 [00:00<00:00,  8.79it/s, v_num=0, train_loss=nan.0, val_loss=4.190]",
     "lightning", None, math.nan, {"val_loss": 4.19}),
    ("Epoch 2: 10%|█         | 1/10 [00:00<00:00, 9.1it/s, train_loss_step=inf.0, train_loss_epoch=2.10]",
     "lightning", None, math.inf, {"extra": {"train_loss_epoch": 2.1}}),
    ("train: 50%|█████     | 50/100 [00:05<00:05, 9.9it/s, loss=1.23, lr=3e-4]", "tqdm", 50, 1.23,
     {"lr": 3e-4, "extra": {"batch": 50.0, "total": 100.0}}),
    # llm.c
    ("step    1/74 | loss 4.300000 (+0.10z)| norm 1.2000 (+0.10z)| lr 1.00e-04 | 12.30 ms | 41.3% bf16 MFU | "
     "45000 tok/s", "llmc", 1, 4.3, {"grad_norm": 1.2, "lr": 1e-4, "tokens_per_sec": 45000.0,
                                     "extra": {"time_ms": 12.3, "mfu": 41.3, "total": 74.0}}),
    ("step   12/74 | loss    -nan (-nanz)| norm   -nan (-nanz)| lr 1.00e-04 | 12.30 ms | 41.3% bf16 MFU | 45000 tok/s",
     "llmc", 12, math.nan, {}),
    ("step    7/74: train loss 3.250000 norm 1.2500 lr 1.00e-04 (12.30 ms, 45000 tok/s)", "llmc", 7, 3.25,
     {"grad_norm": 1.25, "tokens_per_sec": 45000.0}),
    ("step 0: train loss 4.677779 (took 1986.902000 ms)", "llmc", 0, 4.677779, {"extra": {"time_ms": 1986.902}}),
    ("val loss -nan", "llmc", None, None, {}),
    ("s:12 trl:3.2451 lr:0.000600 norm:1.20", "llmc", 12, 3.2451, {"grad_norm": 1.2, "lr": 6e-4}),
    ("s:15 tel:-nan", "llmc", 15, None, {}),
    # nanotron (coloured logging prefix, human_format values)
    ("\x1b[2;3m04/07 15:25:09 [INFO|DP=0|PP=0|TP=0]\x1b[0m: iteration: 12 / 100 | consumed_tokens: 24.6K | "
     "time_per_iteration_ms: 1.25K | tokens_per_sec: 1.64K | tokens_per_sec_per_gpu: 205 | global_batch_size: 2.05K | "
     "grad_norm: infE | lm_loss: 8.4 | lr: 0.0003 | model_tflops_per_gpu: 123 | eta: 0:00:09", "nanotron", 12, 8.4,
     {"grad_norm": math.inf, "tokens_per_sec": 1640.0, "lr": 3e-4, "extra": {"consumed_tokens": 24600.0}}),
    # generic step + key/value pairs
    ("step 100 | loss 2.31 | lr 3e-4", "kv", 100, 2.31, {"lr": 3e-4}),
    ("Step 100: loss=2.31", "kv", 100, 2.31, {}),
    ("step=100 loss=2.31 grad_norm=1.2", "kv", 100, 2.31, {"grad_norm": 1.2}),
    ("Step 9: loss=nan, lr=3.00e-04", "kv", 9, math.nan, {"lr": 3e-4}),
    ("step 7 | loss -nan | lr 3.00e-04 | grad_norm inf", "kv", 7, math.nan, {"grad_norm": math.inf}),
    ("2025-01-01 12:00:00,123 INFO train: step 100/1000 | loss 2.31 | 123.4 ms | tok/s 45000", "kv", 100, 2.31,
     {"tokens_per_sec": 45000.0, "extra": {"total": 1000.0}}),
    ("step: 10, loss: 2.5, val_loss: 2.7", "kv", 10, 2.5, {"val_loss": 2.7}),
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
    # (no longer near misses: "iter 100 loss 2.3", "iteration 100: loss 2.3", "step 250: train loss 2.0"
    # and " iteration 100 | lm loss: 7.3 |" are generic lines now, see tests/watch/test_generic.py)
    "iter abc: loss 2.3",
    "iter 100: loss high, time 1ms",
    "Resuming from step: 100 (loss will be logged)",
    "step: 10 memory: 30GiB",  # torchtitan without a loss
    "step: x  loss: 2.3",
    "Saving checkpoint at iteration 1000 to /ckpt",
    "[rank0]: Traceback (most recent call last):",
    # HF 5.x summary; a dict with a non-numeric value
    "{'train_runtime': '0.2084', 'train_samples_per_second': '575.9', 'train_loss': '1.819', 'epoch': '1'}",
    "12/02/2026 18:14:33 - INFO - __main__ - {'train_runtime': 3.97, 'total_flos': 293437440.0, 'train_loss': 1.8}",
    "{'loss': '[String too long to display, length: 200 > 100. Consider increasing `max_str_len` if needed.]'}",
    "config: {'loss': 'cross_entropy', 'optimizer': 'adamw'}",
    # bars that are not training progress: nested (cursor up), described, no total, no percent
    "  0%|          | 0/2 [00:00<?, ?it/s]\x1b[A",
    "100%|██████████| 2/2 [00:00<00:00, 1083.66it/s]\x1b[A",
    "Writing model shards: 100%|██████████| 1/1 [00:00<00:00, 430.89it/s]",
    "Map: 100%|██████████| 1000/1000 [00:00<00:00, 5000.00 examples/s]",
    "Epoch 3: 45%|#####     | 4500/10000 [12:34<15:20, 5.97it/s]",  # a described bar, no postfix metrics
    "Epoch 0:  40%|████      | 4/10 [00:00<00:00, 9.57it/s, v_num=0]",
    "Validation DataLoader 0:  50%|█████     | 1/2 [00:00<00:00, 220.66it/s, val_loss=2.1]\x1b[A",
    "Training: |          | 0/? [00:00<?, ?it/s]",
    "5it [00:00, 49.08it/s]",
    "50%|",
    " 17%|█▋        | x/30 [00:00<00:00, 49.08it/s]",
    # llm.c lines that are not metrics
    "s:20 eval:0.2500",
    "total average iteration time: 31.000000 ms",
    "HellaSwag: 2500/10042 = 0.248954",
    "Writing checkpoint at step 100",
    "step 7: train loss",
    # prose around "step" and "loss"
    "Resuming from step: 100 (loss will be logged)",
    "At step 100 the loss was 2.3",
    "step 100 | loss went up | lr 3e-4",
    "Saving model at step 100, loss 2.3 is the best so far",
    "stepping: loss=2.3",
    "step 100",
    "step=100 lr=0.001",  # no loss-like value
    "[transformers] `loss_type=None` was set in the config but it is unrecognized.",
    # a CSV-looking line on a stream (CSV is only for watched files)
    "epoch,step,train_loss,val_loss",
    "0,4,4.18,",
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
    # The prefilter never hides a metric line (llm.c's main.log lines carry no keyword: that file is
    # passed whole, see test_wants_all_lines).
    assert any(k in line for k in METRIC_KEYWORDS) or line.startswith("s:")


@pytest.mark.parametrize("line", NEAR_MISSES)
def test_near_misses_do_not_parse(line: str) -> None:
    assert P.parse(line) is None


@pytest.mark.parametrize("text,want", [
    ("nan", math.nan), ("NaN", math.nan), ("-nan", math.nan), ("NAN", math.nan),
    ("inf", math.inf), ("-inf", -math.inf), ("Infinity", math.inf), ("-Infinity", -math.inf), ("INF", math.inf),
    ("1,234", 1234.0), ("7.300E+00", 7.3), ("12.5%", 12.5), (" 3 ", 3.0),
    ("nan.0", math.nan), ("inf.0", math.inf), ("-inf.", -math.inf),  # Lightning's padding
])
def test_number_spellings(text: str, want: float) -> None:
    got = parse_number(text)
    assert got is not None
    assert (math.isnan(got) and math.isnan(want)) or got == want


@pytest.mark.parametrize("text", ["", "abc", "1.2.3", "--1", "nanx", "nan.1", "4.0.0"])
def test_number_rejects(text: str) -> None:
    assert parse_number(text) is None


@pytest.mark.parametrize("text,want", [
    ("24.6K", 24600.0), ("1.23M", 1.23e6), ("3.33B", 3.33e9), ("0.813", 0.813), ("1e-05", 1e-05), ("207", 207.0),
    ("nan", math.nan), ("infE", math.inf), ("-infE", -math.inf),
])
def test_nanotron_human_format(text: str, want: float) -> None:
    got = parse_human(text)
    assert got is not None
    assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want)
    assert parse_human("0:00:24") is None


def test_carriage_return_line_is_its_last_segment() -> None:
    # A tailed file split on \n only keeps tqdm's \r redraws in the line: the last one counts.
    rec = P.parse("\r  5%|▌         | 1/20 [00:00<?, ?it/s]\r 10%|█         | 2/20 [00:00<00:01, 9.9it/s]\r")
    assert rec is not None and rec.fmt == "progress" and rec.step == 2
    assert P.parse("\r 10%|█         | 2/20 [00:00<00:01, 9.9it/s]\r     \r") is not None
    assert P.parse("\r\r   \r") is None


def test_wants_all_lines() -> None:
    p = MetricParser()
    assert p.wants_all_lines("file:/runs/gpt2/main.log")
    assert not p.wants_all_lines("stdout") and not p.wants_all_lines("file:/runs/train.log")
    assert not p.wants_all_lines("file:/runs/metrics.csv")  # until its header is seen
    assert p.parse("epoch,step,train_loss", "file:/runs/metrics.csv") is None
    assert p.wants_all_lines("file:/runs/metrics.csv")


def test_progress_record_shape() -> None:
    rec = P.parse(" 17%|█▋        | 5/30 [00:00<00:00, 49.08it/s]", "stderr")
    assert rec is not None
    assert (rec.step, rec.loss, rec.grad_norm, rec.lr, rec.val_loss, rec.fmt, rec.source, dict(rec.extra)) == (
        5, None, None, None, None, "progress", "stderr", {"total": 30.0})


def test_user_regex_beats_generic_kv_but_not_builtin_formats() -> None:
    p = MetricParser([r"step (?P<step>\d+) \| loss (?P<loss>\S+) \| ppl (?P<ppl>\S+)"])
    rec = p.parse("step 42 | loss 3.25 | ppl 25.8")
    assert rec is not None and rec.fmt == "regex" and rec.extra["ppl"] == 25.8
    rec = p.parse("iter 100: loss 2.3456, time 12.34ms, mfu 1.20%")
    assert rec is not None and rec.fmt == "nanogpt"
    rec = MetricParser(auto=False).parse("step 42 | loss 3.25")
    assert rec is None


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
