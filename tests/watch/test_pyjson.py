"""JSON-shaped metric lines with Python's float spellings (an f-string's ``{"loss": nan}``) are read
as values, at any depth, by the line parser and the JSONL reader; a JSON-shaped line with a
loss-like key that still gives no record has a reason (watch/pyjson.py), bounded in time."""
from __future__ import annotations

import math
import time

import pytest

from supervisor.watch.filerows import FileState, jsonl_records
from supervisor.watch.parsers import MetricParser
from supervisor.watch.pyjson import python_spelled, unread_reason

P = MetricParser()

SPELLED = [
    ('{"step": 20, "loss": nan}', math.nan), ('{"step": 20, "loss": -nan}', math.nan),
    ('{"step": 20, "loss": inf}', math.inf), ('{"step": 20, "loss": -inf}', -math.inf),
    ('{"step": 20, "loss": +inf}', math.inf), ('{"step": 20, "loss": Infinity, "x": nan}', math.inf),
    ('{"step": 20, "loss": NAN}', math.nan), ('{"step": 20, "loss": Nan}', math.nan),
    ('{"step": 20, "loss": -INFINITY}', -math.inf), ('{"step": 20, "loss": infinity}', math.inf),
    ('{"step": 20, "loss": nan, "note": "x"}', math.nan), ('{"step":20,"loss":nan}', math.nan),
    ('{"step": 20, "train": {"loss": nan}}', math.nan), ('{"step": 20, "metrics": {"loss": inf}}', math.inf),
    ('{"step": 20, "loss": nan, "ok": True, "best": None, "skip": False}', math.nan),
    ('{"step": 20, "loss": nan, "deep": {"a": [nan, {"b": -inf}]}}', math.nan),
    ('{"step": 20, "note": "loss is nan, \\"inf\\" too", "loss": 2.5}', 2.5),  # words in strings stay
    ('{"step": 20, "grad_norm": nan, "loss": 2.5}', 2.5),
    ('[rank3]: {"step": 20, "loss": nan}', math.nan),  # torchrun's prefix
    ('2026-01-01 12:00:00 INFO train - {"step": 20, "loss": nan}', math.nan),  # behind a logging prefix
]


def same(a: float | None, b: float) -> bool:
    return a is not None and (a == b or (math.isnan(a) and math.isnan(b)))


@pytest.mark.parametrize("line,loss", SPELLED)
def test_python_spellings_in_a_json_line_are_values(line: str, loss: float) -> None:
    rec = P.parse(line, "stdout")
    assert rec is not None and rec.fmt == "json" and rec.step == 20 and same(rec.loss, loss), (line, rec)
    assert unread_reason(line, 4096) is None


def test_the_f_string_of_the_report_reads_and_its_grad_norm_too() -> None:
    loss, gn = float("nan"), float("inf")
    rec = P.parse(f'{{"step": {20}, "loss": {loss}, "grad_norm": {gn}, "lr": {3e-4}}}', "stdout")
    assert rec is not None and math.isnan(rec.loss or 0) and rec.grad_norm == math.inf and rec.lr == 3e-4


def test_words_that_only_start_like_nan_are_no_value() -> None:
    for word in ("nanx", "info", "nan1", "nan.5", "infs", "_nan"):
        assert python_spelled('{"loss": %s}' % word) is None, word
    assert python_spelled('{"loss": 2.5}') is None  # nothing to read differently: no second decode
    assert python_spelled('["nan", nan]') is None  # no object


@pytest.mark.parametrize("line,why", [
    ('{"step": 20, "loss": tensor(nan)}', "not JSON"),
    ('{"step": 20, "loss": tensor(nan, device=\'cuda:0\')}', "not JSON"),
    ('{"step": 20, "loss": nan', "Expecting ',' delimiter"),  # cut short: what is left wrong is said
    ('{"step": 20, "loss": "tensor(nan)"}', "its loss is text that is no number"),
    ('{"step": 20, "train": {"loss": "tensor(nan)"}}', "its train/loss is text"),
    ('{"step": 20, "loss": nan, "a": ' + "[" * 5000 + "]" * 5000 + "}", "nested deeper"),
    ('INFO x - {"step": 20, "train/loss": np.float32(nan)}', "not JSON"),
])
def test_a_json_metric_line_that_gives_no_record_has_a_reason(line: str, why: str) -> None:
    assert P.parse(line, "stdout") is None
    got = unread_reason(line, 1 << 20)
    assert got is not None and why in got, got


@pytest.mark.parametrize("line", [
    '{"text": "loss went up", "level": "info"}',  # a structured log line: no loss key
    '{"step": 1, "loss": null}',  # no loss this step: not a value that failed
    '{"config": {"lr": nan}}', '{"a": tensor(1)}',  # JSON-shaped but no loss-like key
    'config {"loss": tensor(1)} loaded',  # mid-line, not at its end: not a record
    "{'loss': tensor(nan)}",  # HF's dict: not JSON's
    "step 5 loss nan",
])
def test_other_lines_are_not_said_unread(line: str) -> None:
    assert unread_reason(line, 4096) is None


def test_a_line_longer_than_the_parser_reads_is_said_cheaply() -> None:
    line = '{"step": 20, "loss": 1, "pad": "' + "x" * 10_000_000 + '"}'
    t0 = time.process_time()
    assert P.parse(line, "stdout") is None
    why = unread_reason(line, 4096)
    assert time.process_time() - t0 < 0.5 and why == "longer than 4096 characters: not parsed"


@pytest.mark.parametrize("body", ['"' + '\\"' * 500_000, "nan," * 250_000 + "1", "[" * 300_000])
def test_a_megabyte_line_that_fails_costs_one_bounded_pass(body: str) -> None:
    line = '{"step": 1, "loss": nan, "x": ' + body + "}"
    t0 = time.process_time()
    assert python_spelled(line) is None or body.startswith("nan")
    unread_reason(line, 1 << 21)
    assert time.process_time() - t0 < 2.0


def test_jsonl_lines_with_python_spellings_are_records_and_unreadable_ones_are_told() -> None:
    told: list[tuple[str, str, str]] = []
    f = FileState("/x/metrics.jsonl", "jsonl", (0, 0), 0)
    lines = [b'{"step": %d, "loss": %s}' % (s, b"nan" if s >= 20 else b"2.5") for s in range(1, 23)]
    lines += [b'{"step": 23, "loss": tensor(nan)}', b'{"step": 24, "loss": nan, "x": ' + b"[" * 5000 + b"]" * 5000
              + b"}", b'{"text": "a dataset line"}']
    recs = jsonl_records(f, lines, "file:/x/metrics.jsonl", lambda *a: told.append(a))
    assert [r.step for r in recs] == list(range(1, 23)) and all(math.isnan(r.loss or 0) for r in recs[19:])
    assert [(s, ln[:30]) for s, ln, _ in told] == [("file:/x/metrics.jsonl", '{"step": 23, "loss": tensor(na'),
                                                    ("file:/x/metrics.jsonl", '{"step": 24, "loss": nan, "x":')]
    assert "not JSON" in told[0][2] and "nested deeper" in told[1][2]


def test_unread_jsonl_lines_are_no_probe_misses() -> None:
    # A file whose every line is a metric line no reader reads stays followed (and said), never
    # dropped as "no loss-like key in 50 lines".
    f = FileState("/x/m.jsonl", "jsonl", (0, 0), 0)
    told: list[object] = []
    assert jsonl_records(f, [b'{"step": %d, "loss": tensor(1.0)}' % s for s in range(100)], "file:/x/m.jsonl",
                         lambda *a: told.append(a)) == []
    assert f.dropped is None and len(told) == 100


# ------------------------------------------------------------------ issue 34 D6/D7/R3

@pytest.mark.parametrize("line", [
    '{"step": 8, "loss": nan} ✓ 3.1 µs/tok', '{"step": 8, "loss": nan} (12.3 it/s)', '{"step": 8, "loss": nan} rank=0',
    '2024-01-01 12:00:00 INFO {"step": 8, "loss": nan} rank=0',
    '2024-01-01 INFO {"step": 8, "note": "} and {\\" in a string", "loss": nan} done',
    '{"step": 8, "loss": nan} {"step": 8, "loss": nan}', '{"step": 8, "loss": nan, }', '{"step": 8, "loss": nan,\t]',
    '{"step": 8, "loss": -nan(ind)}', '{"step": 8, "loss": 1.#QNAN}', '{"step": 8, "loss": -1.#IND00, "lr": 0.1}',
    '{"step": 8, "loss": nan(snan), "a": [1, 2, ], }',
    "{'step': 8, 'train_loss': nan}", "{'train_loss': nan, 'epoch': 0.5, 'step': 8}", "{'step': 8, 'lm_loss': nan}",
    "{'step': 8, 'loss': array(nan, dtype=float32)}", "{'step': 8, 'loss': np.array(nan)}",
    "INFO {'step': 8, 'loss': nan} (3.1 it/s)",
])
def test_a_record_with_text_around_it_or_another_loss_key_or_spelling_is_read(line: str) -> None:
    rec = P.parse(line, "stdout")
    if line.endswith("]"):  # a list, not an object: not read, but said
        assert rec is None and unread_reason(line, 4096, embedded=True) is not None
        return
    assert rec is not None and rec.step == 8 and math.isnan(rec.loss or 0), (line, rec)
    assert unread_reason(line, 4096, embedded=True) is None


def test_msvc_inf_spellings_and_trailing_commas_keep_their_values() -> None:
    assert python_spelled('{"loss": 1.#INF, "x": -1.#INF00, "s": "a, }", }') == {
        "loss": math.inf, "x": -math.inf, "s": "a, }"}


def test_the_train_summary_and_a_record_beside_text_with_no_loss_are_no_step() -> None:
    assert P.parse("{'train_runtime': 12.3, 'train_samples_per_second': 3.1, 'train_loss': nan, 'epoch': 3.0}") is None
    assert P.parse('config {"loss_fn": "ce", "nan_check": true} loaded') is None
    assert unread_reason('config {"loss_fn": "ce"} loaded', 4096, embedded=True) is None
    # A line whose record does not read even so is said, with the record's reason.
    got = unread_reason('INFO {"step": 8, "loss": tensor(nan)} rank=0', 4096, embedded=True)
    assert got is not None and "not JSON" in got
    assert unread_reason('INFO {"step": 8, "loss": nan rank=0', 4096, embedded=True) is None  # never closes


def test_an_unclosed_object_behind_text_costs_one_pass() -> None:
    line = 'INFO {"loss": nan' + ', "a": {' * 200_000 + " rank=0"
    t0 = time.process_time()
    assert P.parse(line[:4096], "stdout") is None
    unread_reason(line, 1 << 22, embedded=True)
    assert time.process_time() - t0 < 2.0
