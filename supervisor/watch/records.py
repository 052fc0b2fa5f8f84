"""What every trainer line format shares: numbers as trainers print them (``1,234``, ``nan.0``,
``24.6K``), the key spellings of each metric field, and the :class:`~supervisor.events.MetricRecord`
built from them. Pure functions, used by :mod:`.formats` and :mod:`.parsers`."""

from __future__ import annotations

import math
import re
import time
from typing import Mapping

from ..core.observations import MetricRecord
from .epochsteps import COUNTER_KEY

# A number as trainers print it, non-finite spellings included. Each character has one way to match
# (the fraction only after a "."): "\d[\d,]*\.?\d*" could split a digit run two ways and made a
# crafted run of digits cost time quadratic in its length on every failed match.
# MSVC's C runtime spells them its own way, as a Windows job prints a float: ``-nan(ind)``,
# ``nan(snan)`` (VS 2015+), ``1.#QNAN``, ``-1.#IND``, ``1.#INF``, ``1.#SNAN`` with printf's padding
# digits (``1.#QNAN0``, ``-1.#IND00``; older runtimes). Tried before the digits, so "1." is not taken
# alone from "1.#QNAN"; each is anchored on "#" or "(": no backtracking.
NUM = (r"[-+]?(?:1\.#(?:QNAN|SNAN|IND|INF)\d*|\d[\d,]*(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?"
       r"|(?:nan|NaN|NAN)(?:\((?:ind|IND|snan|SNAN)\))?|inf|Inf|INF|infinity|Infinity|INFINITY)")
# The same MSVC spellings, lower-cased, as parse_number reads a whole value: sign, kind.
_MSVC = re.compile(r"([-+]?)(?:1\.#(qnan|snan|ind|inf)\d*|nan\((?:ind|snan)\))")

# After a NUM in a "key value" field: a non-finite spelling may not run on into letters ("nanmean",
# "infs", "NaNs" are words, not a NaN with a unit); a figure may ("2.31ms"). A lookaround: no backtracking.
NUM_END = r"(?:(?<![A-Za-z])|(?![A-Za-z]))"

# Nouns a bare "nan" / "inf" modifies: "loss nan check passed", "loss nan count 0", "inf guard on".
# After a non-finite spelling joined to its key by a space, one of these makes it a word, not a value.
NAN_NOUNS = frozenset(
    "check checks checker checking guard guards test tests detection detector detectors count counts counter "
    "counters filter filtering hook mask masking flag scan monitor monitoring watchdog handling handler policy "
    "rate ratio fraction frac steps events".split())
_WORD = re.compile(r"[A-Za-z]+")

_HUMAN_SUFFIX = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}

_SPECIALS = {"nan": math.nan, "-nan": math.nan, "+nan": math.nan,
             "inf": math.inf, "+inf": math.inf, "-inf": -math.inf,
             "infinity": math.inf, "+infinity": math.inf, "-infinity": -math.inf}

# Key spellings -> MetricRecord field, for JSON / HF / user dict-like formats.
KEYS: Mapping[str, str] = {
    "step": "step", "iter": "step", "iteration": "step", "global_step": "step", "_step": "step",
    "train/global_step": "step", "trainer/global_step": "step",
    "loss": "loss", "train_loss": "loss", "train/loss": "loss", "lm_loss": "loss", "lm loss": "loss",
    "grad_norm": "grad_norm", "grad-norm": "grad_norm", "gradnorm": "grad_norm", "train/grad_norm": "grad_norm",
    "grad norm": "grad_norm",
    "lr": "lr", "learning_rate": "lr", "learning rate": "lr", "train/learning_rate": "lr", "train/lr": "lr",
    "tokens_per_sec": "tokens_per_sec", "tokens_per_second": "tokens_per_sec", "tps": "tokens_per_sec",
    "tok/s": "tokens_per_sec", "throughput": "tokens_per_sec",
    "val_loss": "val_loss", "eval_loss": "val_loss", "validation_loss": "val_loss", "val/loss": "val_loss",
    "eval/loss": "val_loss", "validation/loss": "val_loss", "valid/loss": "val_loss",
    "rank": "rank",
}
LOSS_FIELDS = ("loss", "val_loss", "grad_norm")


def parse_number(text: str) -> float | None:
    """``"1,234"``, ``"7.3E+00"``, ``"1.2%"``, ``"nan"``, ``"-Infinity"``, ``"-nan(ind)"``, ``"1.#QNAN"`` -> float;
    else None."""
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
        pass
    # Lightning pads numbers to 5 characters: "nan.0", "inf.0", "-inf."
    t = s.lower()
    if (m := _MSVC.fullmatch(t)) is not None:  # "-nan(ind)", "1.#QNAN", "-1.#INF00" (MSVC)
        return (-math.inf if m.group(1) == "-" else math.inf) if m.group(2) == "inf" else math.nan
    if t.endswith("."):
        return _SPECIALS.get(t[:-1])
    if t.endswith(".0"):
        return _SPECIALS.get(t.rstrip("0")[:-1])
    return None


def nan_noun_after(sep: str, raw: str, text: str, end: int) -> bool:
    """A field ``key<sep>raw`` ending at ``end`` of ``text`` whose non-finite value is joined to its key
    by a space and followed by a noun it modifies (``loss nan check passed``): a word in a noun
    phrase, not a value. ``loss=nan check`` and ``loss: nan check`` are values: the sign assigns."""
    if sep.strip():
        return False
    num = parse_number(raw)
    if num is None or num - num == 0:
        return False  # a finite value is a value
    w = _WORD.match(text, end)
    return w is not None and w.group().lower() in NAN_NOUNS


def parse_human(text: str) -> float | None:
    """nanotron's ``human_format``: ``"24.6K"`` -> 24600.0, ``"1.23M"``, ``"infE"`` -> inf."""
    t = text.strip()
    mult = _HUMAN_SUFFIX.get(t[-1:])
    if mult is None:
        return parse_number(t)
    num = parse_number(t[:-1])
    return None if num is None else num * mult


# A two-part path key under one of these names what its last part names ("metrics/loss": a JSON
# line's {"metrics": {"loss": ...}}); one that ends in a split names what its first part names
# ("loss/train", TensorBoard's tag style), or the eval loss ("loss/val").
_TRAIN_HEADS = frozenset({"train", "training", "metrics", "metric"})
_EVAL_TAILS = frozenset({"val", "valid", "validation", "eval", "test"})


def field_of(key: str) -> str | None:
    """The record field a key names (as spelled, else in lower case), or None. A path key is read with
    ``.`` as ``/`` (``eval.loss`` is ``eval/loss``: an eval metric), a path under ``train`` /
    ``training`` / ``metrics`` names what its last part names (``train.loss``, ``training/grad_norm``,
    ``metrics/loss``), and a loss-like key with a split after it is that split's
    (``loss/train``, ``Loss/val``)."""
    canon = KEYS.get(key) or KEYS.get(key.lower())
    if canon is not None or ("." not in key and "/" not in key):
        return canon
    k = key.lower().replace(".", "/")
    canon = KEYS.get(k)
    if canon is None:
        head, _, rest = k.partition("/")
        if "/" in rest:
            return None
        if head in _TRAIN_HEADS:
            canon = KEYS.get(rest)
        elif rest in ("train", "training"):  # TensorBoard-style tags: "Loss/train"
            canon = KEYS.get(head)
        elif rest in _EVAL_TAILS and KEYS.get(head) == "loss":  # "loss/val": the eval loss
            canon = "val_loss"
    return canon


def canonical_key(key: str) -> tuple[str | None, bool]:
    """Key -> (record field or None, is_per_step). Lightning's ``*_step`` / ``*_epoch`` suffixes:
    ``train_loss_step`` is the step's loss, ``train_loss_epoch`` an epoch mean (-> extra)."""
    canon = field_of(key)
    if canon is not None:
        return canon, True
    if key.endswith("_step"):
        return KEYS.get(key[:-5]), True
    return None, False


def to_float(v: object) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        try:
            return float(v)
        except OverflowError:  # an integer beyond 1e308 (JSON allows any): as far from finite as inf
            return math.inf if v > 0 else -math.inf
    if isinstance(v, float):
        return v
    if isinstance(v, str):
        return parse_number(v)
    return None


def make_record(values: Mapping[str, object], fmt: str, source: str, rank: int | None,
            extra: Mapping[str, float] | None = None) -> MetricRecord | None:
    """Build a record from canonical field names; None unless a loss-like value is present."""
    if not any(values.get(k) is not None for k in LOSS_FIELDS):
        return None
    step = values.get("step")
    rk = values.get("rank")
    return MetricRecord(
        at=time.time(), step=int(step) if isinstance(step, (int, float)) and math.isfinite(step) else None,
        loss=values.get("loss"),  # type: ignore[arg-type]
        grad_norm=values.get("grad_norm"),  # type: ignore[arg-type]
        lr=values.get("lr"),  # type: ignore[arg-type]
        tokens_per_sec=values.get("tokens_per_sec"),  # type: ignore[arg-type]
        val_loss=values.get("val_loss"),  # type: ignore[arg-type]
        rank=int(rk) if isinstance(rk, (int, float)) and math.isfinite(rk) else rank,
        source=source, fmt=fmt, extra=dict(extra or {}),
    )


def _items(d: Mapping[str, object]) -> list[tuple[str, object]]:
    """The string-keyed items of ``d``, then those of its dict values one level down as ``outer/inner``
    (``{"train": {"loss": NaN}}`` -> ``train/loss``; ``{"eval": {"loss": ..}}`` -> ``eval/loss``, an
    eval metric). Deeper dicts are not read (a structured logger's record holds its own)."""
    top: list[tuple[str, object]] = []
    nested: list[tuple[str, object]] = []
    for key, raw in d.items():
        if not isinstance(key, str):
            continue
        if isinstance(raw, dict):
            nested.extend((f"{key}/{k}", v) for k, v in raw.items() if isinstance(k, str) and not isinstance(v, dict))
        else:
            top.append((key, raw))
    return top + nested  # a top-level field first: it wins over a nested one of the same name


def record_from_mapping(d: Mapping[str, object], fmt: str, source: str, rank: int | None) -> MetricRecord | None:
    values: dict[str, object] = {}
    extra: dict[str, float] = {}
    local: bool | None = None  # the step came from an "iter" that may restart every epoch
    counter = 0.0
    for key, raw in _items(d):
        canon = field_of(key)
        num = to_float(raw)
        if num is None:
            continue
        if canon is None:
            extra[key] = num
        elif canon == "step":
            is_local = key.lower() in ("iter", "iteration")
            if "step" not in values or (local and not is_local):  # an explicit step beats an iter
                values["step"], local, counter = num, is_local, num
        elif canon not in values:
            values[canon] = num
    if local and "epoch" in extra:
        extra[COUNTER_KEY] = counter  # .epochsteps makes it global
    return make_record(values, fmt, source, rank, extra)


def record_evidence(source: str, rec: MetricRecord) -> str:
    """A record read from a file, spelled as a line for the evidence: ``step 60: loss=nan (tb:/x)``."""
    parts = [f"{name}={getattr(rec, name)}" for name in ("loss", "val_loss", "grad_norm", "lr")
             if getattr(rec, name) is not None]
    head = f"step {rec.step}: " if rec.step is not None else ""
    return f"{head}{', '.join(parts)} ({source})"
