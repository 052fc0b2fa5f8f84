"""Log line -> :class:`~supervisor.events.MetricRecord`, for the trainers people actually run.

Formats recognised (``fmt`` of the record):

- ``json``: ``{"step": 10, "loss": 2.3, "grad_norm": 1.1, "lr": 3e-4}`` (common key spellings).
- ``hf``: Hugging Face Trainer's printed dicts ``{'loss': 2.31, 'grad_norm': 1.1,
  'learning_rate': 5e-05, 'epoch': 0.1}`` and ``{'eval_loss': ...}`` (-> ``val_loss``). HF does
  not print the step, so these records have ``step=None``.
- ``nanogpt``: ``iter 100: loss 2.3456, time 12.34ms, mfu 1.20%`` and
  ``step 250: train loss 2.0123, val loss 2.1045``.
- ``torchtitan``: ``step: 10  loss:  7.9  memory: ...  tps: 1,234  mfu: 1.2%`` (ANSI colours ok).
- ``megatron``: `` iteration  100/ 500000 | ... | lm loss: 7.3E+00 | grad norm: 2.1 | ...`` and
  ``validation loss at iteration 100 | lm loss value: 7.1E+00 | ...``.
- ``regex``: the user's ``[detectors.parsers] regexes`` with named groups.

A line may carry a torchrun rank prefix (``[rank3]:`` / ``[default3]:``), which sets ``rank``.
Every number accepts the spellings of non-finite values Python, C and the trainers print:
``nan``, ``NaN``, ``-nan``, ``inf``, ``-inf``, ``Infinity``, ``INF``.

:class:`MetricParser` is the entry point; :data:`METRIC_KEYWORDS` is the cheap prefilter: a line
that contains none of them cannot be a built-in metric line, so the log watcher never calls the
parser for it.
"""

from __future__ import annotations

import json
import math
import re
from typing import Mapping, Sequence

from ..events import MetricRecord

# Substrings at least one of which every built-in metric line contains.
# ("oss": loss / Loss; "{": JSON and HF dicts, whatever they hold.)
METRIC_KEYWORDS: tuple[str, ...] = ("{", "oss")

ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_RANK_PREFIX = re.compile(r"^\s*\[(?:rank|default)(\d+)\]:\s?")

# A number as trainers print it, non-finite spellings included.
_NUM = r"[-+]?(?:\d[\d,]*\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|nan|NaN|NAN|inf|Inf|INF|infinity|Infinity|INFINITY)"

_NANOGPT_ITER = re.compile(rf"^iter (\d+): loss ({_NUM})(?:, time ({_NUM})ms)?(?:, mfu ({_NUM})%)?(?:,|$)")
_NANOGPT_EVAL = re.compile(rf"^step (\d+): train loss ({_NUM}), val loss ({_NUM})\s*$")
_TITAN = re.compile(rf"\bstep:\s*(\d+)\s+loss:\s*({_NUM})(?=\s|$)")
_TITAN_FIELD = re.compile(rf"\b(grad_norm|memory|tps|tflops|mfu|lr):\s*({_NUM})")
_MEGATRON = re.compile(r"iteration\s+(\d+)\s*/\s*\d+\s*\|")
_MEGATRON_VAL = re.compile(rf"validation loss at iteration\s+(\d+)[^|]*\|\s*lm loss value:\s*({_NUM})")
_HF_PAIR = re.compile(r"'([^'\\]+)':\s*(?:tensor\()?([^,}()]+)\)?")

_SPECIALS = {"nan": math.nan, "-nan": math.nan, "+nan": math.nan,
             "inf": math.inf, "+inf": math.inf, "-inf": -math.inf,
             "infinity": math.inf, "+infinity": math.inf, "-infinity": -math.inf}

# Key spellings -> MetricRecord field, for JSON / HF / user dict-like formats.
_KEYS: Mapping[str, str] = {
    "step": "step", "iter": "step", "iteration": "step", "global_step": "step", "_step": "step",
    "train/global_step": "step", "trainer/global_step": "step",
    "loss": "loss", "train_loss": "loss", "train/loss": "loss", "lm_loss": "loss", "lm loss": "loss",
    "grad_norm": "grad_norm", "grad-norm": "grad_norm", "gradnorm": "grad_norm", "train/grad_norm": "grad_norm",
    "grad norm": "grad_norm",
    "lr": "lr", "learning_rate": "lr", "learning rate": "lr", "train/learning_rate": "lr", "train/lr": "lr",
    "tokens_per_sec": "tokens_per_sec", "tokens_per_second": "tokens_per_sec", "tps": "tokens_per_sec",
    "tok/s": "tokens_per_sec", "throughput": "tokens_per_sec",
    "val_loss": "val_loss", "eval_loss": "val_loss", "validation_loss": "val_loss", "val/loss": "val_loss",
    "eval/loss": "val_loss",
    "rank": "rank",
}
_LOSS_FIELDS = ("loss", "val_loss", "grad_norm")


def parse_number(text: str) -> float | None:
    """``"1,234"``, ``"7.3E+00"``, ``"1.2%"``, ``"nan"``, ``"-Infinity"`` -> float; else None."""
    try:
        return float(text)  # float() itself accepts nan, -nan, inf, Infinity in any case
    except ValueError:
        pass
    s = text.strip().rstrip("%").replace(",", "")
    if not s:
        return None
    special = _SPECIALS.get(s.lower())
    if special is not None:
        return special
    try:
        return float(s)
    except ValueError:
        return None


def _to_float(v: object) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        return parse_number(v)
    return None


def _record(values: Mapping[str, object], fmt: str, source: str, rank: int | None,
            extra: Mapping[str, float] | None = None) -> MetricRecord | None:
    """Build a record from canonical field names; None unless a loss-like value is present."""
    if not any(values.get(k) is not None for k in _LOSS_FIELDS):
        return None
    step = values.get("step")
    rk = values.get("rank")
    return MetricRecord(
        step=int(step) if isinstance(step, (int, float)) and math.isfinite(step) else None,
        loss=values.get("loss"),  # type: ignore[arg-type]
        grad_norm=values.get("grad_norm"),  # type: ignore[arg-type]
        lr=values.get("lr"),  # type: ignore[arg-type]
        tokens_per_sec=values.get("tokens_per_sec"),  # type: ignore[arg-type]
        val_loss=values.get("val_loss"),  # type: ignore[arg-type]
        rank=int(rk) if isinstance(rk, (int, float)) and math.isfinite(rk) else rank,
        source=source, fmt=fmt, extra=dict(extra or {}),
    )


def _from_mapping(d: Mapping[str, object], fmt: str, source: str, rank: int | None) -> MetricRecord | None:
    values: dict[str, object] = {}
    extra: dict[str, float] = {}
    for key, raw in d.items():
        if not isinstance(key, str):
            continue
        canon = _KEYS.get(key) or _KEYS.get(key.lower())
        num = _to_float(raw)
        if num is None:
            continue
        if canon is None:
            extra[key] = num
        elif canon not in values:
            values[canon] = num
    return _record(values, fmt, source, rank, extra)


def parse_json(line: str, source: str = "", rank: int | None = None) -> MetricRecord | None:
    if not (line.startswith("{") and line.endswith("}")):
        return None
    try:
        d = json.loads(line)  # accepts NaN / Infinity / -Infinity as Python does
    except ValueError:
        return None
    if not isinstance(d, dict):
        return None
    return _from_mapping(d, "json", source, rank)


def parse_hf(line: str, source: str = "", rank: int | None = None) -> MetricRecord | None:
    if not (line.startswith("{'") and line.endswith("}")):
        return None
    pairs = _HF_PAIR.findall(line)
    if not pairs:
        return None
    d: dict[str, object] = {}
    for key, raw in pairs:
        num = parse_number(raw)
        if num is None:
            return None  # a dict with non-numeric values is not a Trainer log line
        d[key] = num
    if "loss" not in d and "eval_loss" not in d:
        return None  # train summaries ({'train_runtime': ..., 'train_loss': ...}) are not steps
    d.pop("train_loss", None)
    return _from_mapping(d, "hf", source, rank)


def parse_nanogpt(line: str, source: str = "", rank: int | None = None) -> MetricRecord | None:
    m = _NANOGPT_ITER.match(line)
    if m:
        loss = parse_number(m.group(2))
        if loss is None:
            return None
        t_ms, mfu = m.group(3, 4)
        extra: dict[str, float] = {}
        if t_ms is not None:
            extra["time_ms"] = float(t_ms)
        if mfu is not None:
            extra["mfu"] = float(mfu)
        # The hot path of the commonest format: built directly, not through _record.
        return MetricRecord(step=int(m.group(1)), loss=loss, rank=rank, source=source, fmt="nanogpt", extra=extra)
    m = _NANOGPT_EVAL.match(line)
    if m:
        return _record({"step": int(m.group(1)), "loss": parse_number(m.group(2)),
                        "val_loss": parse_number(m.group(3))}, "nanogpt", source, rank,
                       {"eval": 1.0})
    return None


def parse_torchtitan(line: str, source: str = "", rank: int | None = None) -> MetricRecord | None:
    m = _TITAN.search(line)
    if not m:
        return None
    values: dict[str, object] = {"step": int(m.group(1)), "loss": parse_number(m.group(2))}
    extra: dict[str, float] = {}
    for name, raw in _TITAN_FIELD.findall(line, m.end()):
        num = parse_number(raw)
        if num is None:
            continue
        if name in ("grad_norm", "lr"):
            values[name] = num
        elif name == "tps":
            values["tokens_per_sec"] = num
        else:
            extra[name] = num
    return _record(values, "torchtitan", source, rank, extra)


def parse_megatron(line: str, source: str = "", rank: int | None = None) -> MetricRecord | None:
    pos = line.find("iteration ")
    m = _MEGATRON.match(line, pos) if pos >= 0 and (pos == 0 or not line[pos - 1].isalnum()) else None
    if m:
        values: dict[str, object] = {"step": int(m.group(1))}
        extra: dict[str, float] = {}
        # "| name: value |" fields; split/partition is several times faster than a regex here.
        for part in line[m.end():].split("|"):
            name, sep, raw = part.partition(":")
            if not sep:
                continue
            num = parse_number(raw)
            if num is None:
                continue
            name = name.strip()
            canon = _KEYS.get(name)
            if canon:
                values.setdefault(canon, num)
            else:
                extra[name] = num
        return _record(values, "megatron", source, rank, extra)
    m = _MEGATRON_VAL.search(line)
    if m:
        return _record({"step": int(m.group(1)), "val_loss": parse_number(m.group(2))}, "megatron", source, rank)
    return None


class MetricParser:
    """Auto-detecting parser: built-in formats first, then the user's regexes.

    ``parse(line)`` is pure and thread-safe. Lines longer than ``max_line_chars`` are not parsed
    (no trainer prints a metric line that long; the cap keeps a pathological line cheap).
    """

    def __init__(self, regexes: Sequence[str] = (), *, auto: bool = True, max_line_chars: int = 4096) -> None:
        self.auto = auto
        self.max_line_chars = max_line_chars
        self.regexes = tuple(re.compile(p) for p in regexes)

    def parse(self, line: str, source: str = "") -> MetricRecord | None:
        if len(line) > self.max_line_chars:
            return None
        if "\x1b" in line:
            line = ANSI_RE.sub("", line)
        rank: int | None = None
        if line.startswith("[") or line.startswith(" ["):
            m = _RANK_PREFIX.match(line)
            if m:
                rank = int(m.group(1))
                line = line[m.end():]
        line = line.strip()
        if self.auto:
            rec = self._auto(line, source, rank)
            if rec is not None:
                return rec
        for rx in self.regexes:
            m = rx.search(line)
            if m:
                rec = self._from_regex(m, source, rank)
                if rec is not None:
                    return rec
        return None

    @staticmethod
    def _auto(line: str, source: str, rank: int | None) -> MetricRecord | None:
        if line.startswith("{"):
            return parse_hf(line, source, rank) if line.startswith("{'") else parse_json(line, source, rank)
        if line.startswith("iter ") or line.startswith("step "):
            return parse_nanogpt(line, source, rank)
        if "iteration" in line and "|" in line:
            return parse_megatron(line, source, rank)
        if "step:" in line and "loss:" in line:
            return parse_torchtitan(line, source, rank)
        return None

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
        if not any(values.get(k) is not None for k in _LOSS_FIELDS) and "step" not in values:
            return None
        step = values.get("step")
        rk = values.get("rank")
        return MetricRecord(
            step=int(step) if isinstance(step, float) and math.isfinite(step) else None,
            loss=values.get("loss"), grad_norm=values.get("grad_norm"), lr=values.get("lr"),  # type: ignore[arg-type]
            tokens_per_sec=values.get("tokens_per_sec"), val_loss=values.get("val_loss"),  # type: ignore[arg-type]
            rank=int(rk) if isinstance(rk, float) and math.isfinite(rk) else rank,
            source=source, fmt="regex", extra=extra,
        )
