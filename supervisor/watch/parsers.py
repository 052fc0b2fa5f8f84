"""Log line -> :class:`~supervisor.events.MetricRecord`, for the trainers people actually run.

Formats recognised (``fmt`` of the record); ``tests/corpus/`` holds captured real output of each:

- ``json``: ``{"step": 10, "loss": 2.3, "grad_norm": 1.1, "lr": 3e-4}`` (common key spellings),
  also behind a logging prefix (``... INFO - {"step": ...}``); Python's ``nan`` / ``inf`` of an
  f-string's line (``{"loss": nan}``) read as values (:mod:`.pyjson`), MSVC's (``-nan(ind)``) and a
  trailing comma too; with text after the record (``{"step": 8, "loss": nan} rank=0``, ``... (12.3
  it/s)``), and before it: the balanced ``{...}`` is read (one pass for its closing brace). A Python
  dict (``{'step': 8, 'train_loss': nan}``) is read as ``hf`` with any loss-like key of every format.
- ``hf``: Hugging Face Trainer's printed dicts. transformers 4.x prints numbers
  ``{'loss': 2.31, 'grad_norm': nan, 'learning_rate': 5e-05, 'epoch': 0.1}``, 5.x quoted strings
  ``{'loss': '2.31', 'grad_norm': 'nan', ...}``; ``{'eval_loss': ...}`` -> ``val_loss``; the final
  ``{'train_runtime': ..., 'train_loss': ...}`` summary is not a step (None). A dict behind a logging
  prefix (``01/02/2025 12:00:00 - INFO - __main__ - {'loss': ...}``) or behind a progress bar on the
  same line is found. HF does not print the step: ``step=None`` (the log watcher pairs the dict
  with the training bar's ``progress`` records).
- ``progress``: a tqdm *training* bar segment, no description, not nested:
  `` 17%|█▋        | 5/30 [00:00<00:00, 49.08it/s]`` ->
  ``MetricRecord(step=5, loss=None, fmt="progress", extra={"total": 30.0})``. HF's bar counts global
  steps (after a resume it jumps to the resumed step). Nested bars (the segment carries tqdm's
  cursor-up ``ESC[A``: HF's eval bar during training), described bars (``Writing model shards: ...``,
  ``Map: ...``) and bars without a total (``5it [...]``, ``0/?``) give None. An undescribed bar of
  anything else (a standalone ``trainer.evaluate()``, a user's ``for x in tqdm(files)``) looks the
  same: ``extra["total"]`` is there to tell them apart.
- ``lightning``: PyTorch Lightning's TQDM bar with metrics in its postfix,
  ``Epoch 0:  40%|████      | 4/10 [00:00<00:00, 9.57it/s, v_num=0, train_loss=4.170]`` -> loss
  (``loss=`` / ``train_loss=`` / ``*_step=``), ``val_loss``; ``step=None`` and
  ``extra={"epoch", "batch", "total"}``: the bar counts batches of the current epoch; the log watcher
  makes that the global step, ``epoch x total + batch`` (:mod:`.epochsteps`; with gradient accumulation
  that counts batches, not optimizer steps: the job's metric files carry the optimizer step).
  Lightning pads values, so NaN is printed ``nan.0`` (and inf ``inf.0``). A bar with another
  description (or none) and a loss in its postfix (a hand-written loop's ``tqdm(range(300),
  desc="train")`` + ``set_postfix(loss=...)``) is ``tqdm``, same shape, but with the bar's counter
  as ``step``, so a NaN's onset is the bar's position; unless its description names an epoch
  (``desc=f"epoch {e}"``: batches of that epoch, stepless as Lightning's) or an evaluation
  (``eval``, ``val``, ``test``: eval batches). Nested bars
  (validation) give None.
- ``csv``: rows of a CSV metrics file (Lightning's ``CSVLogger`` ``metrics.csv``): see
  :meth:`MetricParser.parse`; the parser remembers the last header line per ``file:`` source.
- ``nanogpt``: ``iter 100: loss 2.3456, time 12.34ms, mfu 1.20%`` and
  ``step 250: train loss 2.0123, val loss 2.1045``.
- ``llmc``: karpathy/llm.c: ``step    1/74 | loss 4.300000 (+0.10z)| norm 1.2000 (+0.10z)| lr 1.00e-04
  | 12.30 ms | 41.3% bf16 MFU | 45000 tok/s`` and its older ``step 1/74: train loss 4.3 ...`` forms
  (step as printed: 1-based), ``step 0: train loss 4.677779 (took 1986.902000 ms)`` (train_gpt2.c,
  0-based), ``val loss 4.5`` (step None) and its ``main.log`` lines ``s:0 trl:4.3000 lr:0.000600
  norm:1.20`` / ``s:0 tel:4.5000`` (0-based). glibc prints NaN as ``nan`` or ``-nan``.
- ``nanotron``: ``iteration: 12 / 100 | consumed_tokens: 24.6K | ... | grad_norm: 0.92 | lm_loss: 8.4 |
  lr: 0.0003 | ...`` (after its coloured logging prefix); values in nanotron's ``human_format``
  (``24.6K``, ``1.23M``; inf prints as ``infE``).
- ``torchtitan``: ``step: 10  loss:  7.9  memory: ...  tps: 1,234  mfu: 1.2%`` (ANSI colours ok).
- ``megatron``: `` iteration  100/ 500000 | ... | lm loss: 7.3E+00 | grad norm: 2.1 | ...`` and
  ``validation loss at iteration 100 | lm loss value: 7.1E+00 | ...``.
- ``kv``: a generic ``step N`` followed by key/value pairs only: ``step 100 | loss 2.31 | lr 3e-4``,
  ``Step 100: loss=2.31, lr=3e-4``, ``step=100 loss=2.31 grad_norm=1.2`` (a logging prefix before
  ``step`` is fine). Everything after the step must be ``key value`` / ``key=value`` / ``key: value``
  pairs (or bare ``12.3 ms``-style figures between ``|`` or ``,``), so prose (``Resuming from
  step: 100 (loss will be logged)``) is not a metric line.
- ``generic``: any other line made only of ``key=value`` / ``key: value`` / ``key value`` fields
  (``|``, ``,`` or space separated) behind an optional logging prefix, with a loss-like key:
  ``2026-12-03 21:06:25,513 INFO trainer: epoch 0 | iter 60/300 | train_loss=nan | lr=0.05``. Tried
  last; see :mod:`.generic`.
- ``regex``: the user's ``[detectors.parsers] regexes`` with named groups.

A line may carry a torchrun rank prefix (``[rank3]:`` / ``[default3]:``), which sets ``rank``.
A line that still holds ``\r`` (a tailed file is split on ``\n`` only) is parsed as its last
non-blank ``\r`` segment: what a terminal would show. Every number accepts the spellings of
non-finite values Python, C and the trainers print: ``nan``, ``NaN``, ``-nan``, ``inf``, ``-inf``,
``Infinity``, ``INF``, ``'nan'`` (HF 5.x), ``nan.0`` (Lightning), ``infE`` (nanotron).

:class:`MetricParser` is the entry point; :data:`METRIC_KEYWORDS` is the cheap prefilter: a line
that contains none of them cannot be a built-in metric line, so the log watcher never calls the
parser for it. The one exception is a CSV data row (digits and commas only): see
:meth:`MetricParser.wants_all_lines`.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from typing import Sequence

from ..core.observations import MetricRecord
from .formats import (
    CONTROL_RE,
    QUOTED_VALUE,
    RANK_PREFIX,
    csv_header,
    last_segment,
    parse_bar,
    parse_hf,
    parse_json,
    parse_kv,
    parse_llmc,
    parse_megatron,
    parse_nanogpt,
    parse_nanotron,
    parse_torchtitan,
    plain,
)
from .generic import parse_generic
from .pyjson import embedded_object
from .records import LOSS_FIELDS, canonical_key, make_record, parse_number, record_from_mapping
from .structlines import json_parts

# Substrings at least one of which every built-in metric line contains, except in the files for which
# MetricParser.wants_all_lines is True (CSV data rows, llm.c's main.log: metric lines only, no keyword).
# ("oss": loss / Loss / lm_loss, and so llm.c, nanotron, kv, Lightning postfixes; "{": JSON and HF
# dicts, whatever they hold; "%|": tqdm bars, for the progress records.)
METRIC_KEYWORDS: tuple[str, ...] = ("{", "oss", "%|")


# The step a loguru message names beside metrics bound to its record ("step 25", "iter=25").
_MSG_STEP = re.compile(r"(?i)\b(?:global_step|step|iter|iteration)\b\s*[=:]?\s*(\d+)")


def bound_record(bound: dict[str, object], msg: str | None, rec: MetricRecord | None, source: str,
                 rank: int | None) -> MetricRecord | None:
    """loguru's ``record.extra`` read as a JSON line's keys; its step, when it names none, from the
    message's record or the message's own ``step N``. The message's record when extra holds no metric."""
    got = record_from_mapping(bound, "json", source, rank)
    if got is None:
        return rec
    if got.step is None:
        m = _MSG_STEP.search(msg) if msg else None
        step = rec.step if rec is not None and rec.step is not None else int(m.group(1)) if m else None
        got = dataclasses.replace(got, step=step)
    return got


class MetricParser:
    """Auto-detecting parser: built-in formats first, then the user's regexes.

    ``parse(line, source)`` is thread-safe and, except for CSV files, pure. Lines longer than
    ``max_line_chars`` are not parsed (no trainer prints a metric line that long; the cap keeps a
    pathological line cheap).

    CSV (``fmt="csv"``): a row means nothing without its header, so the parser remembers, per
    ``source`` that starts with ``file:`` (a watched file), the last header line it saw: comma-
    separated metric names, no spaces, at least one loss-like column (``epoch,step,train_loss,
    val_loss``). Each later line of that source with as many fields, all numbers or empty, is a row
    (``step`` from its ``step`` column as the file says it: Lightning writes the 0-based index of
    the optimizer step, 4 for the 5th; empty cells are absent values). A new header line replaces
    the old one (Lightning rewrites the file with a wider header when new metrics appear). Since a
    data row holds no keyword, the log watcher must pass every line of a source for which
    :meth:`wants_all_lines` is True; :meth:`set_csv_header` lets a tailer that starts at the end of
    an existing file hand the header over.
    """

    MAX_CSV_SOURCES = 64

    def __init__(self, regexes: Sequence[str] = (), *, auto: bool = True, max_line_chars: int = 4096) -> None:
        self.auto = auto
        self.max_line_chars = max_line_chars
        self.regexes = tuple(re.compile(p) for p in regexes)
        self._csv: dict[str, tuple[str, ...]] = {}

    def wants_all_lines(self, source: str) -> bool:
        """True for a source whose metric lines carry none of :data:`METRIC_KEYWORDS`, so the
        prefilter must not drop its lines: a CSV file whose header was seen, and a watched file
        named ``main.log`` (llm.c's ``s:12 trl:3.2451 ...`` log; every line of it is a metric)."""
        return source in self._csv or (source.startswith("file:") and source.endswith("/main.log"))

    def set_csv_header(self, source: str, line: str) -> bool:
        """Remember ``line`` as the CSV header of ``source``; False if it is not a metrics header."""
        names = csv_header(line.strip())
        if names is None:
            return False
        if source not in self._csv and len(self._csv) >= self.MAX_CSV_SOURCES:
            oldest = list(self._csv)[:1]  # list(): no iterator over a dict another thread may change
            if oldest:
                self._csv.pop(oldest[0], None)
        self._csv[source] = names
        return True

    def _parse_csv(self, line: str, source: str, header: tuple[str, ...]) -> MetricRecord | None:
        fields = line.strip().split(",")
        if len(fields) != len(header):
            self.set_csv_header(source, line)
            return None
        values: dict[str, object] = {}
        extra: dict[str, float] = {}
        for name, raw in zip(header, fields):
            if not raw:
                continue
            num = parse_number(raw)
            if num is None:
                self.set_csv_header(source, line)  # a new header of the same width, or not a row
                return None
            canon, per_step = canonical_key(name)
            if canon is not None and per_step:
                values.setdefault(canon, num)
            else:
                extra[name] = num
        return make_record(values, "csv", source, None, extra)

    def parse(self, line: str, source: str = "") -> MetricRecord | None:
        if len(line) > self.max_line_chars:
            return None
        if self._csv:
            header = self._csv.get(source)
            if header is not None:
                return self._parse_csv(line, source, header)
        if ("%|" in line and "=" not in line and "{" not in line and "oss" not in line and "\x1b" not in line
                and "\r" not in line):
            # A bar with no postfix metrics, the commonest line with a keyword that is no metric:
            # decided here (a described one gives None) without the general path's work.
            pos = line.find("%|")
            head = line[:pos].rstrip("0123456789").strip()
            if head and head[0] != "[" and not self.regexes:
                return None
        if "\r" in line:
            line = last_segment(line)
        nested = False
        if CONTROL_RE.search(line):
            nested = "\x1b[A" in line  # tqdm moved the cursor up: an inner (nested) bar
            line = plain(line)  # a control byte or escape right after a value ("loss nan\x07") ends it
        rank: int | None = None
        if line.startswith("[") or line.startswith(" ["):
            m = RANK_PREFIX.match(line)
            if m:
                rank = int(m.group(1))
                line = line[m.end():]
        line = line.strip()
        if self.auto:
            rec = self._auto(line, source, rank, nested)
            if rec is not None:
                return rec
        for rx in self.regexes:
            m = rx.search(line)
            if m:
                rec = self._from_regex(m, source, rank)
                if rec is not None:
                    return rec
        # The generic "step N key value ..." form last: the user's own pattern for a line beats a guess.
        if self.auto:
            if line.startswith("{"):
                # A structured log line (loguru serialize=True, structlog JSON) with no metric key: its
                # message is an ordinary log line (one level; json_message never returns a JSON text).
                msg, bound = json_parts(line)
                rec = self.parse(msg, source) if msg is not None else None
                return bound_record(bound, msg, rec, source, rank) if bound is not None else rec
            if ("'" in line or '"' in line) and "{" not in line:
                line = QUOTED_VALUE.sub(r"\2", line)  # "loss 'nan'": a value in quotes is the value
            if "tep" in line or "STEP" in line:
                rec = parse_kv(line, source, rank)
                if rec is not None:
                    return rec
            # Ordinary fields of a hand-written loop, last of all: it claims no line another format reads.
            return parse_generic(line, source, rank)
        return None

    def _auto(self, line: str, source: str, rank: int | None, nested: bool) -> MetricRecord | None:
        if line.startswith("{"):
            if line.endswith("}"):
                rec = parse_hf(line, source, rank) if line.startswith("{'") else parse_json(line, source, rank)
                if rec is not None:
                    return rec
            return self._embedded(line, source, rank)  # text after the record: "{...} (12.3 it/s)", "{...} {...}"
        if line.startswith("iter ") or line.startswith("step "):
            return parse_nanogpt(line, source, rank) or parse_llmc(line, source, rank)
        if "iteration" in line and "|" in line:
            if "iteration: " in line:
                return parse_nanotron(line, source, rank)
            return parse_megatron(line, source, rank)
        if "step:" in line and "loss:" in line:
            rec = parse_torchtitan(line, source, rank)
            if rec is not None:
                return rec
        if line.endswith("}"):
            # A dict behind a logging prefix or a progress bar: HF first, then JSON.
            i = line.find("{'")
            if i > 0:
                return parse_hf(line[i:], source, rank)
            i = line.find('{"')
            if i > 0:
                return parse_json(line[i:], source, rank)
        if "{" in line:
            rec = self._embedded(line, source, rank)  # "... INFO {"step": 8, "loss": nan} rank=0"
            if rec is not None:
                return rec
        if "%|" in line:
            return parse_bar(line, source, rank, nested)
        if line.startswith("val loss ") or line.startswith("s:"):
            return parse_llmc(line, source, rank)
        if source.startswith("file:") and "," in line:
            self.set_csv_header(source, line)
        return None

    @staticmethod
    def _embedded(line: str, source: str, rank: int | None) -> MetricRecord | None:
        """The record of the balanced ``{...}`` inside a line with text after it (and maybe before):
        a JSON object (``{"``) or a Python dict (``{'``), whichever opens first (:func:`.pyjson.embedded_object`:
        one linear pass), then read as a whole line of its kind is."""
        j, h = line.find('{"'), line.find("{'")
        quote = '"' if h < 0 or 0 <= j < h else "'"
        obj = embedded_object(line, quote) if j >= 0 or h >= 0 else None
        if obj is None or (j if quote == '"' else h) + len(obj) == len(line):
            return None  # none, or it runs to the line's end: the whole line was read so already
        return parse_json(obj, source, rank) if quote == '"' else parse_hf(obj, source, rank)

    @staticmethod
    def _from_regex(m: re.Match[str], source: str, rank: int | None) -> MetricRecord | None:
        values: dict[str, object] = {}
        extra: dict[str, float] = {}
        for name, raw in m.groupdict().items():
            if raw is None:
                continue
            num = parse_number(raw)
            if num is None:
                continue
            if name in ("step", "loss", "grad_norm", "lr", "tokens_per_sec", "val_loss", "rank"):
                values[name] = num
            else:
                extra[name] = num
        if not any(values.get(k) is not None for k in LOSS_FIELDS) and "step" not in values:
            return None
        step = values.get("step")
        rk = values.get("rank")
        return MetricRecord(
            at=time.time(), step=int(step) if isinstance(step, float) and math.isfinite(step) else None,
            loss=values.get("loss"), grad_norm=values.get("grad_norm"), lr=values.get("lr"),  # type: ignore[arg-type]
            tokens_per_sec=values.get("tokens_per_sec"), val_loss=values.get("val_loss"),  # type: ignore[arg-type]
            rank=int(rk) if isinstance(rk, float) and math.isfinite(rk) else rank,
            source=source, fmt="regex", extra=extra,
        )
