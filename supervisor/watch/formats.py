"""The line formats of the trainers, one ``parse_<format>(line, source, rank)`` each (the numbers,
key spellings and records they share are in :mod:`.records`). Pure functions; :class:`~supervisor.watch.parsers.MetricParser`
picks which one a line goes to (see its module for the formats and the prefilter).
"""

from __future__ import annotations

import json
import re
import time

from ..core.observations import MetricRecord
from .records import (KEYS, LOSS_FIELDS, NUM, NUM_END, canonical_key, field_of, make_record, nan_noun_after,
                      parse_human, parse_number, record_from_mapping)
from .pyjson import python_spelled

ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
# Every other escape sequence (OSC: a terminal title or hyperlink, up to BEL or ST; DCS, SOS, PM, APC;
# a two-byte escape) and every other control character (C0 but tab, DEL, C1) a job may print right
# after a value ("loss nan\x07", "loss=nan\x00"): a separator for parsing, as a terminal shows none
# of them. The line shown (console, job.log, evidence) keeps them; only the parsing reads past them.
CONTROL_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")
_ESCAPE_RE = re.compile(r"\x1b(?:[\]PX^_][^\x07\x1b]*(?:\x07|\x1b\\)?|[ -/]*[0-~])?")
# A number or non-finite spelling in quotes outside a dict ("loss 'nan'", 'loss "nan"'): its value.
QUOTED_VALUE = re.compile(r"""(['"])([-+]?(?:\d[\d.,]*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|(?i:nan|inf(?:inity)?)))\1""")


def plain(line: str) -> str:
    """``line`` as its fields are read: colour codes (CSI) dropped (they sit inside tokens:
    ``\x1b[1mloss\x1b[0m``), every other escape sequence and control character a space."""
    if "\x1b" in line:
        line = _ESCAPE_RE.sub(" ", ANSI_RE.sub("", line))
    return CONTROL_RE.sub(" ", line)
RANK_PREFIX = re.compile(r"^\s*\[(?:rank|default)(\d+)\]:\s?")

_NANOGPT_ITER = re.compile(rf"^iter (\d+): loss ({NUM})(?:, time ({NUM})ms)?(?:, mfu ({NUM})%)?(?:,|$)")
_NANOGPT_EVAL = re.compile(rf"^step (\d+): train loss ({NUM}), val loss ({NUM})\s*$")
_TITAN = re.compile(rf"\bstep:\s*(\d+)\s+loss:\s*({NUM})(?=\s|$)")
_TITAN_FIELD = re.compile(rf"\b(grad_norm|memory|tps|tflops|mfu|lr):\s*({NUM})")
_MEGATRON = re.compile(r"iteration\s+(\d+)\s*/\s*\d+\s*\|")
_MEGATRON_VAL = re.compile(rf"validation loss at iteration\s+(\d+)[^|]*\|\s*lm loss value:\s*({NUM})")
# 'key': value, 'key': 'value' (5.x), 'key': tensor(value), 'key': np.float64(value),
# 'key': array(nan, dtype=float32) (a numpy 0-d array's repr: the value, its dtype after the comma)
_HF_PAIR = re.compile(r"'([^'\\]+)':\s*(?:tensor\(|np\.float\d*\(|(?:np\.)?array\(|')?([^,}()']+)'?\)?")

# tqdm: "{desc}: {pct}%|{bar}| {n}/{total} [{elapsed}<{remaining}, {rate}{postfix}]" (desc optional).
_BAR_TAIL = re.compile(r"[^|]*\|\s*(\d+)/(\d+)\s*\[([^\]]*)\]")
_LIGHTNING_DESC = re.compile(r"^Epoch (\d+)(?:/\d+)?:?$")
# A bar named after an epoch counts that epoch's batches; an evaluation bar counts eval batches: no step.
_STEPLESS_DESC = re.compile(r"(?i)\b(?:epoch|val|valid|validation|validating|eval|evaluat\w*|test\w*|predict\w*|infer\w*)")

_LLMC_STEP = re.compile(rf"^step\s+(\d+)/(\d+)(?::|\s*\|)\s*(?:train )?loss\s+({NUM})")
_LLMC_C = re.compile(rf"^step (\d+): train loss ({NUM}) \(took ({NUM}) ms\)$")
_LLMC_NORM = re.compile(rf"\bnorm\s+({NUM})")
_LLMC_LR = re.compile(rf"\blr\s+({NUM})")
_LLMC_MS = re.compile(rf"(?:^|[\s(|])({NUM})\s*ms\b")
_LLMC_TOKS = re.compile(rf"(?:^|[\s(|,])({NUM})\s*tok/s")
_LLMC_MFU = re.compile(rf"(?:^|[\s|])({NUM})%[^|%]*MFU")
_LLMC_ACC = re.compile(rf"\(acc ({NUM})\)")
_LLMC_VAL = re.compile(rf"^val loss ({NUM})$")
_LLMC_LOG = re.compile(rf"^s:(\d+) (trl|tel):({NUM})(?: lr:({NUM}) norm:({NUM}))?$")

_NANOTRON = re.compile(r"\biteration: (\d+) / (\d+) \|")

# kv: "step N" (or step=N, step: N, step N/M), then only key/value pairs.
_KV_STEP = re.compile(r"(?<![\w/.\-])(?:global_step|[Ss]tep|STEP)(?:\s*[=:]\s*|\s+)(\d+)(?:\s*/\s*(\d+))?(?![\w.])")
_KV_KEY = r"([A-Za-z_][\w./\-]*)"
_KV_UNIT = r"(?:[A-Za-z%/]+)?"
_KV_PART = re.compile(rf"{_KV_KEY}\s*(?:=|:|\s)\s*({NUM}){NUM_END}{_KV_UNIT}")
# Group 2 joins key and value: a space alone matters for records.NAN_NOUNS ("loss nan count 0").
_KV_SEQ = re.compile(rf"{_KV_KEY}(\s*=\s*|:\s*|\s+)({NUM}){NUM_END}{_KV_UNIT}(?:\s+|$)")
_KV_ANON = re.compile(rf"\(?({NUM})\s*{_KV_UNIT}\)?")
_CSV_NAME = re.compile(r"[A-Za-z_][\w./\-]*")

def parse_json(line: str, source: str = "", rank: int | None = None) -> MetricRecord | None:
    if not (line.startswith("{") and line.endswith("}")):
        return None
    try:
        d = json.loads(line)  # accepts NaN / Infinity / -Infinity as Python does
    except ValueError:  # an f-string's {"loss": nan}: Python's spellings read as JSON's (else None)
        d = python_spelled(line)
    except RecursionError:  # nested deeper than the decoder goes
        return None
    if not isinstance(d, dict):
        return None
    return record_from_mapping(d, "json", source, rank)


def parse_hf(line: str, source: str = "", rank: int | None = None) -> MetricRecord | None:
    """4.x ``{'loss': 2.3, ...}`` and 5.x ``{'loss': '2.3', ...}`` dicts (the line is the dict)."""
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
    if "train_runtime" in d:
        return None  # the train summary ({'train_runtime': ..., 'train_loss': ...}) is not a step
    # Any loss-like key (records.KEYS, as every other format reads them): 'loss', 'eval_loss', and a
    # hand-written dict's 'train_loss', 'lm_loss', 'train/loss' (make_record: None without one).
    return record_from_mapping(d, "hf", source, rank)


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
        # The hot path of the commonest format: built directly, not through make_record.
        return MetricRecord(step=int(m.group(1)), loss=loss, rank=rank, source=source, fmt="nanogpt", extra=extra,
                            at=time.time())
    m = _NANOGPT_EVAL.match(line)
    if m:
        return make_record({"step": int(m.group(1)), "loss": parse_number(m.group(2)),
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
    return make_record(values, "torchtitan", source, rank, extra)


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
            canon = KEYS.get(name)
            if canon:
                values.setdefault(canon, num)
            else:
                extra[name] = num
        return make_record(values, "megatron", source, rank, extra)
    pos = line.find("validation loss at iteration")  # matched at its first place only: linear in the line
    m = _MEGATRON_VAL.match(line, pos) if pos >= 0 else None
    if m:
        return make_record({"step": int(m.group(1)), "val_loss": parse_number(m.group(2))}, "megatron", source, rank)
    return None



def parse_bar(line: str, source: str = "", rank: int | None = None, nested: bool = False) -> MetricRecord | None:
    """A tqdm bar segment: ``progress`` (undescribed training bar), ``lightning`` / ``tqdm`` (a
    loss in the postfix), else None. ``nested``: the raw segment carried tqdm's cursor-up."""
    if nested:
        return None  # an inner bar (HF eval during training, Lightning validation)
    pos = line.find("%|")
    if pos < 1:
        return None
    i = pos
    while i > 0 and line[i - 1].isdigit():
        i -= 1
    if i == pos:
        return None
    desc = line[:i].rstrip()
    if desc and "=" not in line:
        return None  # a described bar without postfix metrics ("Map: 100%|...", "Writing model shards")
    m = _BAR_TAIL.match(line, pos + 2)
    if m is None:
        return None
    n, total = int(m.group(1)), int(m.group(2))
    values: dict[str, object] = {}
    extra: dict[str, float] = {}
    inside = m.group(3)
    if "=" in inside:
        for item in inside.split(", "):
            key, sep, raw = item.partition("=")
            if not sep:
                continue
            key = key.strip()
            if key == "v_num":
                continue
            num = parse_number(raw)
            if num is None:
                continue
            canon, per_step = canonical_key(key)
            if canon is not None and canon != "step" and per_step:
                values.setdefault(canon, num)
            else:
                extra[key] = num
    if any(values.get(k) is not None for k in LOSS_FIELDS):
        le = _LIGHTNING_DESC.match(desc)
        if le:
            extra["epoch"] = float(le.group(1))
        elif _STEPLESS_DESC.search(desc) is None:
            # A hand-written loop's training bar (tqdm(range(steps), desc="train") + set_postfix(loss=..)):
            # its counter is the step, so a NaN's onset is the bar's position, not the last step some
            # other line printed. A bar named after an epoch (batches of that epoch) or an evaluation
            # (eval batches) gives no step.
            values["step"] = n
        extra["batch"] = float(n)
        extra["total"] = float(total)
        return make_record(values, "lightning" if le else "tqdm", source, rank, extra)
    if desc:
        return None
    return MetricRecord(at=time.time(), step=n, rank=rank, source=source, fmt="progress", extra={"total": float(total)})


def parse_llmc(line: str, source: str = "", rank: int | None = None) -> MetricRecord | None:
    """karpathy/llm.c stdout (train_gpt2.cu and train_gpt2.c) and its ``main.log``."""
    if line.startswith("step"):
        m = _LLMC_STEP.match(line)
        if m and (" ms" in line or "tok/s" in line):  # every llm.c "step N/M" format has them
            values: dict[str, object] = {"step": int(m.group(1)), "loss": parse_number(m.group(3))}
            extra: dict[str, float] = {"total": float(m.group(2))}
            rest = line[m.end():]
            for rx, name in ((_LLMC_NORM, "grad_norm"), (_LLMC_LR, "lr"), (_LLMC_TOKS, "tokens_per_sec")):
                f = rx.search(rest)
                if f:
                    values[name] = parse_number(f.group(1))
            for rx, name in ((_LLMC_MS, "time_ms"), (_LLMC_MFU, "mfu"), (_LLMC_ACC, "acc_loss")):
                f = rx.search(rest)
                if f:
                    num = parse_number(f.group(1))
                    if num is not None:
                        extra[name] = num
            return make_record(values, "llmc", source, rank, extra)
        m = _LLMC_C.match(line)
        if m:
            return make_record({"step": int(m.group(1)), "loss": parse_number(m.group(2))}, "llmc", source, rank,
                           {"time_ms": parse_number(m.group(3)) or 0.0})
        return None
    if line.startswith("val loss "):
        m = _LLMC_VAL.match(line)
        return make_record({"val_loss": parse_number(m.group(1))}, "llmc", source, rank) if m else None
    if line.startswith("s:"):
        m = _LLMC_LOG.match(line)
        if m is None:
            return None
        if m.group(2) == "tel":
            return make_record({"step": int(m.group(1)), "val_loss": parse_number(m.group(3))}, "llmc", source, rank)
        return make_record({"step": int(m.group(1)), "loss": parse_number(m.group(3)),
                        "lr": parse_number(m.group(4)) if m.group(4) else None,
                        "grad_norm": parse_number(m.group(5)) if m.group(5) else None}, "llmc", source, rank)
    return None


def parse_nanotron(line: str, source: str = "", rank: int | None = None) -> MetricRecord | None:
    """huggingface/nanotron's ``LoggerWriter.add_scalars_from_list`` line."""
    m = _NANOTRON.search(line)
    if m is None:
        return None
    values: dict[str, object] = {"step": int(m.group(1))}
    extra: dict[str, float] = {"total": float(m.group(2))}
    for part in line[m.end():].split(" | "):
        name, sep, raw = part.partition(": ")
        if not sep:
            continue
        name = name.strip()
        num = parse_human(raw)
        if num is None:
            continue
        canon = KEYS.get(name)
        if canon is not None and canon != "step":
            values.setdefault(canon, num)
        else:
            extra[name] = num
    return make_record(values, "nanotron", source, rank, extra)


def parse_kv(line: str, source: str = "", rank: int | None = None) -> MetricRecord | None:
    """``step N`` then key/value pairs only (see the module docstring)."""
    m = _KV_STEP.search(line)
    if m is None:
        return None
    rest = line[m.end():].lstrip(" \t:|,;")
    if not rest:
        return None
    pairs: list[tuple[str, str]] = []
    if "|" in rest or "," in rest:
        for part in rest.split("|" if "|" in rest else ","):
            part = part.strip()
            if not part:
                continue
            p = _KV_PART.fullmatch(part)
            if p:
                pairs.append((p.group(1), p.group(2)))
            elif _KV_ANON.fullmatch(part) is None:
                return None
    else:
        pos, end = 0, len(rest)
        while pos < end:
            p = _KV_SEQ.match(rest, pos)
            if p is None or nan_noun_after(p.group(2), p.group(3), rest, p.end()):
                return None  # "loss nan check passed": a noun phrase, not a value (the generic parser decides)
            pairs.append((p.group(1), p.group(3)))
            pos = p.end()
    values: dict[str, object] = {"step": int(m.group(1))}
    extra: dict[str, float] = {}
    if m.group(2):
        extra["total"] = float(m.group(2))
    for key, raw in pairs:
        num = parse_number(raw)
        if num is None:
            return None
        canon = field_of(key)
        if canon is None:
            extra[key] = num
        elif canon != "step":
            values.setdefault(canon, num)
    return make_record(values, "kv", source, rank, extra)


def csv_header(line: str) -> tuple[str, ...] | None:
    """A CSV header of metric names with at least one loss-like column, else None."""
    if "," not in line or " " in line:
        return None
    names = tuple(line.split(","))
    if len(names) < 2 or not all(_CSV_NAME.fullmatch(n) for n in names):
        return None
    if not any(canonical_key(n)[0] in LOSS_FIELDS for n in names):
        return None
    return names


def last_segment(line: str) -> str:
    """What a terminal shows of a line with carriage returns: its last non-blank segment."""
    for seg in reversed(line.split("\r")):
        if seg.strip():
            return seg
    return ""
