"""Crafted log lines: per line format, the inputs that make a backtracking regex do the most work
(long digit runs where a number must be followed by something else, a format's anchor repeated
with nothing after it, long runs of spaces between separators). Shared by the linearity test
(tests/watch/test_parsers_linear.py), the fuzz suite's seeds and the bench row "worst crafted line
per format" (bench/bench_watch.py).

``CRAFTED[fmt]`` is a list of ``build(n) -> line of about n characters``. ``parse_all(parser, line)``
does what the daemon does with one line: the metric parser, then every built-in text rule.
"""
from __future__ import annotations

from typing import Callable

from supervisor.watch.parsers import MetricParser
from supervisor.watch.pyjson import unread_reason
from supervisor.watch.textrules import CKPT_RULES, CUDA_ERROR, GPU_RULES, NAN_TEXT_RULES, NCCL_RULES, OOM_RULES, XID_LINE

Build = Callable[[int], str]


def _rep(head: str, unit: str, tail: str = "") -> Build:
    return lambda n: head + unit * max(1, (n - len(head) - len(tail)) // len(unit)) + tail


CRAFTED: dict[str, list[Build]] = {
    "json": [_rep('{"loss": ', "1", "x}"), _rep('{"loss": 1, "a": "', "\\u00", '}'),
             _rep('{"a": {', '"b": 1, ', '"c": 1}}'), _rep('{"step": 1, "train": {"loss": ', "1", "x}}"),
             _rep('{"record": {"message": "step 1", "extra": {', '"a": 1, ', '"loss": 1}}}'),
             _rep('{"record": {"message": "', "step ", '1", "extra": {"loss": 1}}}'),
             # issue 34: Python's spellings (an f-string's {"loss": nan}) read on a second pass; a line that
             # still fails is said (pyjson.unread_reason): unclosed escapes, many words, deep, many keys
             _rep('{"loss": nan, "a": "', '\\"', "}"), _rep('{"loss": ', "nan,", "x}"),
             _rep('{"loss": nan, "a": ', "[", "]}"), _rep('{"loss": nan, "', 'a": inf, "', "x}"),
             _rep('{"step": 1, "loss": nan, "a": "', "nan ", "x}"),
             # issue 34 D7/R3: the balanced object inside a line with text around it (one pass for its
             # closing brace), trailing commas and MSVC's spellings read on the second pass
             _rep('INFO {"loss": nan', ', "a": {', " rank=0"), _rep('{"loss": nan} ', '{"', ""),
             _rep('x {"loss": nan, "a": "', '{\\"', '"} y'), _rep('{"loss": nan', ", ", "} x"),
             _rep('{"loss": 1', ", -nan(ind)", "} x"), _rep('{"loss": 1', ", 1.#QNAN", "} x")],
    "hf": [_rep("{'loss': ", "1", "x}"), _rep("{'", "'a", "}"), _rep("{'loss': 1, '", "a': ", "}"),
           _rep("INFO {'loss': nan", ", 'a': {", " rank=0"), _rep("{'loss': ", "array(nan, ", "} x")],
    "nanogpt": [_rep("iter 1: loss ", "1", "x"), _rep("step 1: train loss 1, val loss ", "1", " x")],
    "torchtitan": [_rep("step: 1  loss: ", "1", "x"), _rep("", "step: 1 "), _rep("step: 1 loss: 1 ", "tps: 1", "x")],
    "megatron": [_rep(" iteration 1/ 10 | lm loss: ", "1", " x"), _rep("", "validation loss at iteration 1 "),
                 _rep(" iteration 1/ 10 |", " a:", "|")],
    "tqdm": [_rep("Epoch 0: 1%|x| 1/2 [a, loss=", "1", "}"), _rep("train: 1%|x| 1/2 [", "a=1, ", "x"),
             _rep("", "1%|")],
    "llmc": [_rep("step 1/10 | loss ", "1", " ms x"), _rep("step 1/10 | loss 1 | ", " 1", " x"),
             _rep("s:1 trl:", "1", "x"), _rep("val loss ", "1", "x")],
    "nanotron": [_rep("iteration: 1 / 10 | lm_loss: ", "1", "}"), _rep("iteration: 1 / 10 ", "| a: ", "x")],
    "kv": [_rep("step 1 loss ", "1", "x"), _rep("step 1 | ", "loss ", "x"), _rep("step ", " ", "1 loss 1 x"),
           _rep("step 1 loss nan", " ", "count"), _rep("step 1 loss nan ", "loss nan ", "x")],
    "generic": [_rep("INFO ", "1", "}"), _rep("loss=1 a", " ", "b"), _rep("2026-12-03 21:06:25 INFO a: ", "a.", " x"),
                _rep("epoch 1 ", "loss 1 ", "x"), _rep("loss=1, ", ",", "x"),
                # issue 34 D1: torch scalars, settings (k=word), fields then words, "nan <noun>"
                _rep("step 1 loss ", "tensor(1,", "x"), _rep("step 1 loss tensor(", "1", "x"),
                _rep("step 1 loss tensor(1, ", "a", "x"), _rep("step 1 ", "a=b ", "loss nan x"),
                _rep("step 1 a=", "=", " x"), _rep("step 1 loss nan", " ", "check"),
                _rep("step 1 loss ", "nan", " x"),
                # issue 34 D1, round 4: a trailing dict (long, unclosed, deep), punctuation, brackets
                _rep("step 1 loss 1 {", "'a': 1, ", "}"), _rep("step 1 loss 1 ", "{", "x"),
                _rep("step 1 loss 1 {'a': ", "[", "]}"), _rep("step 1 loss nan", ".", " x"),
                _rep("[step 1] ", "[a 1] ", "x"), _rep("step 1 loss/", "train/", " nan")],
    "csv": [_rep("loss", ",loss", ",1 2")],
    "text rules": [_rep("", "ProcessGroupNCCL"), _rep("", "NCCL error "), _rep("", "Connection reset by peer"),
                   _rep("", "NVRM: Xid ("), _rep("", "nan "), _rep("", "size mismatch for "),
                   _rep("", "Detected NaN "), _rep("", "loss is nan "), _rep("", "CUDA error: "), _rep("", "Cuda failure 2 "),
                   _rep("", "CUBLAS_STATUS_"), _rep("", "cuDNN error: CUDNN_STATUS_")],
}

_RULES = [r.pattern for r in (*OOM_RULES, *NCCL_RULES, *GPU_RULES, *CKPT_RULES, *NAN_TEXT_RULES)] + [CUDA_ERROR]


def parse_all(parser: MetricParser, line: str) -> None:
    """The work the watcher does for one line with every keyword in it: parse it, run every rule."""
    if parser.parse(line, "file:/x/metrics.log") is None and '{"' in line:
        unread_reason(line, 1 << 20, embedded=True)  # the log watcher's look at a line no parser read (a JSONL file's bound)
    for rx in _RULES:
        rx.search(line)
    XID_LINE.search(line)
