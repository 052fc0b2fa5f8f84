"""``generic``: ordinary log lines no trainer-specific format claims, as a hand-written loop prints them.

    2026-12-03 21:06:25,513 INFO trainer: epoch 0 | iter 60/300 | train_loss=nan | lr=0.05
    [2026-12-03 21:06:25] INFO epoch 1, step 60, loss: 2.31, lr 3e-4
    INFO:root:it 60 train/loss=2.31 grad_norm=1.2
    Epoch [1/10], Step [60/300], Loss: 2.3012
    step=25 loss=nan phase=train
    step: 25 | loss: nan | grad_norm: 1.2 | done

A logging prefix (asctime, level, logger name) is dropped first. Then the line's *leading fields*
are read, separated by ``|``, ``,``, ``;`` or spaces: ``key=value``, ``key: value``, ``key value``
(a key may be two words when the second is ``loss`` / ``norm`` / ``rate``: ``lm loss``), a value may
be ``N/M`` or ``[N/M]`` (``iter 60/300``), a torch / numpy scalar (``tensor(nan)``,
``tensor(2.31, device='cuda:0')``, ``np.float64(2.31)``), a bare figure with a unit between
separators (``12.3 ms``), a bare counter ``58/300`` (the step when no key names one) and clock
values (``eta: 0:03:12``, skipped). ``key=<not a number>`` (``phase=train``, ``is_nan=False``) is
skipped: a setting, not a metric, and not prose. Tokens with no word in them are noise and skipped
wherever they stand: symbols, emoji, invalid UTF-8 (``\ufffd``), figures (``12.3 ms``) and units
with a ``/`` or a non-ASCII letter (``3.1 µs/tok ✓``), so ``step 25 loss nan µs/tok`` is the NaN it
says.

The first word that is not a field ends the fields; what follows it is not read (``ok``, ``done``,
``check passed``, ``(no NaN)``). A line made only of fields is a record when it holds a loss-like
value. A line whose fields are followed by words is one only when its fields name the step (a step
key or an ``N/M`` counter) *and* a loss-like value, so ``step 25 loss nan ok`` is a NaN and ``epoch
3 loss 2.5 took 30 s`` stays prose. A line that starts with a word is prose, whatever it says
after: ``skipping step 25 because loss is nan`` yields nothing (a real NaN said in words: the rule
is a value in a field; the NaN text rules make it a ``nan_mentioned`` warning, never a stop).
So a NaN value in the leading fields stops the job whatever words follow (``step 25 loss nan,
skipping batch`` too: the value is there), with one exception: a non-finite spelling joined to its
key by a space and followed at once by a noun it modifies (``step 25: loss nan check passed``,
``loss inf guard on``, ``loss nan count 0``: see ``records.NAN_NOUNS``) is a word in a noun phrase, not a
value, and the fields end before it. ``nan`` / ``inf`` with letters after them (``nanmean``,
``infs``, ``NaNs``) are words, never a value with a unit.

Punctuation right after a value ends a sentence or a clause, not the fields: ``step 25 loss 0.5.``,
``loss nan.``, ``loss nan!`` are values (and ``loss nan. Check passed`` no noun phrase); ``loss
nan?`` is a question and ends them. A key may open a bracket its value closes (``[step 25]
loss=nan``). A dict after the fields (``step 4 loss nan {'lr': 0.1}``, ``... {"metrics": {"loss":
NaN}}``) is read when it parses as a Python or JSON literal of at most :data:`MAX_DICT_CHARS`
characters (:func:`trailing_dict`: ``ast.parse``, nothing evaluated; one nested level, as
``outer/inner``; the line's own fields win); one that does not parse is words after the fields.
A line that *is* a dict is HF's or JSON's, never this parser's.

The step comes from ``step`` / ``iter`` / ``iteration`` / ``it`` / ``global_step`` (an explicit
``step`` / ``global_step`` beats an ``iter`` before it; ``batch N/M`` and ``batch_idx`` count too);
``epoch`` goes to ``extra``, and a counter that may restart every epoch (``iter``, ``it``,
``batch``, a bare ``N/M``) beside an epoch goes to ``extra["epoch_counter"]``: :mod:`.epochsteps`
turns it into the global step. A record needs a loss-like value (``loss``, ``train_loss``, ``lm
loss``, ``train loss``, ``val_loss``, ``eval_loss``, ``train/loss``, ``train.loss``, ``loss_step``,
``grad_norm`` ...; ``eval.loss`` is an eval metric, never the training loss): a NaN is a value in
a metric, never a word in prose.

Tried last (after every trainer format and the user's regexes), so it changes no line another
format reads. Pure functions, each regex tried at most once per token: linear in the line.
"""

from __future__ import annotations

import ast
import re

from ..core.observations import MetricRecord
from .epochsteps import COUNTER_KEY
from .records import NUM, NUM_END, canonical_key, make_record, nan_noun_after, parse_number, to_float

# asctime (ISO or HF's 12/03/2026 21:06:25), optionally bracketed, with optional ms and zone.
_TIME = (r"\[?(?:\d{4}-\d{2}-\d{2}[ T]|\d{2}/\d{2}/\d{4} )?\d{2}:\d{2}:\d{2}(?:[.,]\d+)?"
         r"(?:Z|[+-]\d{2}:?\d{2})?\]?")
_LEVEL = r"\[?(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\]?"
# "<time> <level> <name>:", "<time> - <level> - <name> - ", "INFO:root:", "[time] INFO", ...
_PREFIX = re.compile(
    rf"^(?:{_TIME}\s*(?:[-|]\s*)?)?"
    r"(?:[\w.\-]+\s+-\s+(?=\[?[A-Z]{4,8}\b))?"  # "%(asctime)s - %(name)s - %(levelname)s - "
    rf"(?:{_LEVEL}(?:\s*[-|:]\s*|\s+)"
    r"(?:(?:\[[\w.\-]+\]|[\w.\-]+)(?::\s*|\s+-\s+|\s*\|\s*)(?!\s*[-+]?(?:\d|\.\d|nan\b|inf\b)))?)?")
_TIME_ONLY = re.compile(rf"^{_TIME}\s*(?:[-|:]\s*)?")

_VAL = rf"(?:\[\s*)?({NUM}){NUM_END}(?:\s*/\s*(\d+))?(?:\s*\])?"
_UNIT = r"(?:[A-Za-z%]+(?:/[A-Za-z]+)?)?"
_KEY = r"([A-Za-z_][\w./\-]*(?:\s(?:loss|norm|rate))?)"
# One field, and a run of fields separated by spaces (the part between two separators). _SEQ's
# group 2 is what joins key and value: a space alone matters for records.NAN_NOUNS.
# A key may open a bracket its value closes ("[step 25] loss=nan"); a value may end a sentence or a
# clause ("loss 0.5.", "loss nan,", "loss nan!"): punctuation, not a word. "loss=nan?" is a question:
# it ends the fields.
_PUNCT = r"([:.,;!]?)"
_PAIR = re.compile(rf"\[?{_KEY}(?:\s*[=:]\s*|\s+){_VAL}{_UNIT}[.,;!]?")
# A field may end right before a non-ASCII character ("loss nan✓"): that token is noise (below).
_SEQ = re.compile(rf"\[?{_KEY}(\s*[=:]\s*|\s+){_VAL}{_UNIT}{_PUNCT}(?:\s+|$|(?=[^\x00-\x7f]))")  # "Epoch 3: val_loss=2.1"
_ANON = re.compile(rf"\(?({NUM})\s*{_UNIT}\)?")
# "phase=train", "is_nan=False", "device=cuda:0": a setting, skipped. Not a value that starts like a
# number or a non-finite spelling ("loss=nan?" is no setting: it ends the fields).
_STR_FIELD = re.compile(r"[A-Za-z_][\w./\-]*=(?![-+]?(?:\d|\.\d|(?i:nan|inf)(?!\w)))[^\s|,;]+(?:\s+|$)")
# torch / numpy scalars as printed: "tensor(nan)", "tensor([2.31])", "tensor(2.31, device='cuda:0',
# grad_fn=<AddBackward0>)", "np.float64(2.31)" -> the number. No comma in the number and no space
# before it: each has one way to match, so a failed try costs the distance to the next parenthesis.
_WRAPPED = re.compile(r"\b(?:tensor|(?:np|numpy)\.float(?:16|32|64)?)\(\[?"
                      r"([-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|(?i:nan|inf(?:inity)?)))"
                      r"\]?(?:,[^()]*)?\)")
# A token with no word in it (symbols, emoji, U+FFFD from invalid UTF-8, figures, "µs/tok"): what is
# left of it after dropping every character but ASCII letters and "/" is empty or a chain of units.
_NOISE_TOKEN = re.compile(r"\S+(?:\s+|$)")
# "12.3 ms" among fields; digits only: a bare "nan" is a word (a wrapped line's tail), not noise.
_FIGURE_SEQ = re.compile(r"\(?[-+]?(?:\d[\d,]*(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+)\s*"
                         rf"{_UNIT}\)?(?:\s+|$|(?=[^\x00-\x7f]))")
# A set, not a regex alternation: "(?:(?:ms|[mun]?s)/)*" on "ms/ms/.../x" backtracked exponentially.
_UNIT_WORDS = frozenset(
    "s ms us ns min h b kb mb gb tb pb kib mib gib tib flop flops kflops mflops gflops tflops pflops mfu tok toks "
    "token tokens sample samples seq seqs it its step steps iter iters gpu gpus batch batches img imgs image "
    "images".split())
_NON_WORD = re.compile(r"[^A-Za-z/]+")
_COUNTER = re.compile(r"\[?\s*(\d+)\s*/\s*(\d+)\s*\]?")
_COUNTER_SEQ = re.compile(r"\[?(\d+)/(\d+)\]?(?:\s+|$)")
# "eta: 0:03:12", "time 00:01:02.5": a clock value, no metric; skipped so the line is not prose.
_CLOCK_SEQ = re.compile(r"[A-Za-z_][\w./\-]*(?:\s*[=:]\s*|\s+)\d+:\d\d(?::\d\d)?(?:\.\d+)?(?:\s+|$)")
# Commas split fields only when a key or a bracket follows: "1,234" stays one number.
# No "\s*" around the separators: tried at every position of a run of spaces it rescanned the run
# (quadratic in its length); each part is stripped instead.
_SPLIT = re.compile(r"\||;|,(?=\s*[A-Za-z_\[(])")

_STEP_KEYS = frozenset({"step", "iter", "iteration", "it", "global_step", "global step", "steps", "iters", "batch_idx"})
# Counters that may restart every epoch (an explicit step / global_step is the run's): see .epochsteps.
_LOCAL_COUNTERS = frozenset({"iter", "iteration", "it", "iters", "batch", "batch_idx"})
# Loss spellings of hand-written loops beyond the shared KEYS table (normalised: lower case, "_").
_LOSSES = {"training_loss": "loss", "avg_loss": "loss", "mean_loss": "loss", "total_loss": "loss",
           "train_loss": "loss", "loss": "loss", "lm_loss": "loss",
           "valid_loss": "val_loss", "validation_loss": "val_loss", "val_loss": "val_loss", "eval_loss": "val_loss",
           "grad_norm": "grad_norm", "learning_rate": "lr"}


def strip_prefix(line: str) -> str:
    """The line without its logging prefix (asctime, level, logger name), if it has one."""
    if not line[:1].isalnum() and line[:1] != "[":
        return line
    m = _PREFIX.match(line)
    if m and m.end():
        return line[m.end():]
    m = _TIME_ONLY.match(line)
    return line[m.end():] if m and m.end() else line


def field_name(key: str) -> str | None:
    """The record field (or ``"step"`` / ``"epoch"``) a key of a generic line names, else None."""
    canon, per_step = canonical_key(key)
    if canon is not None and per_step:
        return canon
    k = key.lower().replace(" ", "_").replace("-", "_")
    if k in _STEP_KEYS or k.replace("_", " ") in _STEP_KEYS:
        return "step"
    if k == "epoch":
        return "epoch"
    if k.endswith("_step"):
        k = k[:-5]
    return _LOSSES.get(k) or _LOSSES.get(k.rsplit("/", 1)[-1] if k.startswith(("train/", "training/")) else "")


def is_noise(token: str) -> bool:
    """True for a token that carries no word: ``✓``, ``🚀``, ``\ufffd``, ``(12.3)``, and a unit with a
    ``/`` or a non-ASCII letter (``µs/tok``, ``it/s``). A bare ASCII unit is not (``took 30 s`` stays
    prose: a line of words that happens to hold figures)."""
    letters = _NON_WORD.sub("", token)
    if not letters.strip("/"):
        return True
    return ("/" in token or not token.isascii()) and all(not w or w.lower() in _UNIT_WORDS
                                                         for w in letters.split("/"))


Field = tuple[str, str, str | None]


def read_fields(body: str) -> tuple[list[Field], tuple[int, int] | None, bool]:
    """The leading fields of ``body`` (key, value, total), its bare ``N/M`` counter, and whether the
    fields are the whole line (False: a word ended them; what follows it is not read)."""
    fields: list[Field] = []
    counter: tuple[int, int] | None = None
    for part in _SPLIT.split(body):
        part = part.strip()
        if not part:
            continue
        p = _PAIR.fullmatch(part)
        if p:
            fields.append((p.group(1), p.group(2), p.group(3)))
            continue
        c = _COUNTER.fullmatch(part)
        if c:
            counter = (int(c.group(1)), int(c.group(2)))
            continue
        if _ANON.fullmatch(part):
            continue
        pos, end = 0, len(part)
        while pos < end:  # "epoch 0 iter 60 loss 2.3": fields separated by spaces only
            s = _SEQ.match(part, pos)
            if s is not None:
                if s.group(5) in ("", ":") and nan_noun_after(s.group(2), s.group(3), part, s.end()):
                    return fields, counter, False  # "loss nan check passed": a noun phrase
                fields.append((s.group(1), s.group(3), s.group(4)))
                pos = s.end()
                continue
            c = _COUNTER_SEQ.match(part, pos)
            if c is not None:
                counter = (int(c.group(1)), int(c.group(2)))
                pos = c.end()
                continue
            c = _CLOCK_SEQ.match(part, pos) or _STR_FIELD.match(part, pos)
            if c is None:
                c = _FIGURE_SEQ.match(part, pos) or _NOISE_TOKEN.match(part, pos)
                if c is None or not (c.re is _FIGURE_SEQ or is_noise(c.group().strip())):
                    return fields, counter, False  # a word that is no field: the fields end here
            pos = c.end()
    return fields, counter, True


def parse_generic(line: str, source: str = "", rank: int | None = None) -> MetricRecord | None:
    tail: dict[str, object] | None = None
    brace = line.find("{")
    if brace >= 0:
        if not line[:brace].strip():
            return None  # a line that is a dict is HF's or JSON's: their parsers decided
        tail = trailing_dict(line[brace:])  # None: not a dict, so words after the fields
        line = line[:brace]
    body = strip_prefix(line).strip().strip("|,; \t")
    if not body:
        return None
    if "(" in body:
        body = _WRAPPED.sub(r"\1", body)  # "loss tensor(nan)" -> "loss nan"
    fields, counter, whole = read_fields(body)
    if not fields:
        return None
    if brace >= 0 and tail is None:
        whole = False  # "{" that opens no dict: words
    values: dict[str, object] = {}
    extra: dict[str, float] = {}
    local: bool | None = None  # the step came from a counter that may restart every epoch
    for key, raw, total in fields:
        num = parse_number(raw)
        if num is None:
            return None
        name = field_name(key)
        k = key.lower()
        if name is None and k == "batch" and total:
            name = "step"  # "batch 50/100": a position (a batch size has no total)
        if name == "step":
            is_local = k in _LOCAL_COUNTERS
            # The first step key, except that an explicit step / global_step beats an iter before it.
            if ("step" not in values or (local and not is_local)) and num == num and abs(num) != float("inf"):
                values["step"], local = int(num), is_local
                extra.pop("total", None)
                if total:
                    extra["total"] = float(total)
        elif name == "epoch":
            extra["epoch"] = num
        elif name is not None:
            values.setdefault(name, num)
        else:
            extra[key] = num
    if tail and whole:
        _merge_dict(tail, values, extra)
    if "step" not in values and counter is not None:
        values["step"], extra["total"] = counter[0], float(counter[1])
        local = True
    if not whole and "step" not in values:
        return None  # fields then words: a record only with its step ("epoch 3 loss 2.5 took 30 s" is prose)
    if local and "epoch" in extra:
        extra[COUNTER_KEY] = float(values["step"])  # type: ignore[arg-type]  # epochsteps makes it global
    return make_record(values, "generic", source, rank, extra)


# A dict after a line's fields ("step 4 loss nan {'lr': 0.1}", "... {"metrics": {"loss": NaN}}"):
# read when it parses as a Python or JSON literal of at most this many characters (else it is words).
MAX_DICT_CHARS = 4096
_SCALAR_CALLS = frozenset({"tensor", "float", "float16", "float32", "float64"})


def trailing_dict(text: str) -> dict[str, object] | None:
    """The string-keyed numbers of a dict literal (Python's repr or JSON, ``nan`` / ``NaN`` /
    ``Infinity`` / ``tensor(x)`` / ``np.float64(x)`` values, one nested level as a dict), or None when
    ``text`` is no dict literal. :func:`ast.parse` only: nothing is evaluated; bounded by
    :data:`MAX_DICT_CHARS` (the parser itself refuses nesting past 200 brackets)."""
    text = text.strip()
    if len(text) > MAX_DICT_CHARS or not text.endswith("}"):
        return None
    try:
        node = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return _dict_of(node, nested=True) if isinstance(node, ast.Dict) else None


def _dict_of(node: ast.Dict, nested: bool) -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in zip(node.keys, node.values):
        if not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
            continue
        if isinstance(v, ast.Dict):
            if nested:
                out[k.value] = _dict_of(v, nested=False)
            continue
        num = _number(v)
        if num is not None:
            out[k.value] = num
    return out


def _number(v: ast.expr) -> float | None:
    """``2.3``, ``-1``, ``'nan'`` (HF 5.x), ``nan`` / ``NaN`` / ``Infinity`` (a name), ``tensor(nan)``,
    ``np.float64(2.3)``, ``tensor([2.3])`` -> the number; anything else None."""
    sign = 1.0
    if isinstance(v, ast.UnaryOp) and isinstance(v.op, (ast.USub, ast.UAdd)):
        sign, v = (-1.0 if isinstance(v.op, ast.USub) else 1.0), v.operand
    if isinstance(v, ast.Call) and v.args:
        f = v.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        if name not in _SCALAR_CALLS:
            return None
        v = v.args[0]
        if isinstance(v, ast.List) and len(v.elts) == 1:
            v = v.elts[0]
        if isinstance(v, ast.UnaryOp) and isinstance(v.op, ast.USub):
            sign, v = -sign, v.operand
    num: float | None = None
    if isinstance(v, ast.Constant) and isinstance(v.value, (int, float, str)) and not isinstance(v.value, bool):
        num = to_float(v.value)
    elif isinstance(v, ast.Name):
        num = parse_number(v.id)
    return None if num is None else sign * num


def _merge_dict(tail: dict[str, object], values: dict[str, object], extra: dict[str, float]) -> None:
    """A trailing dict's numbers beside the line's own fields, which win (one nested level is read as
    ``outer/inner``: ``metrics/loss`` is the loss, ``eval/loss`` an eval metric). An HF train summary's
    ``train_loss`` is no step's loss."""
    if "train_runtime" in tail:
        tail.pop("train_loss", None)
    top = [(k, v) for k, v in tail.items() if not isinstance(v, dict)]
    nested = [(f"{k}/{n}", x) for k, v in tail.items() if isinstance(v, dict) for n, x in v.items()]
    for key, raw in top + nested:  # a top-level field first: it wins over a nested one
        if not isinstance(raw, float):
            continue
        name = field_name(key)
        if name == "step":
            if "step" not in values and raw - raw == 0:
                values["step"] = int(raw)
        elif name == "epoch":
            extra.setdefault("epoch", raw)
        elif name is not None:
            values.setdefault(name, raw)
        else:
            extra.setdefault(key, raw)
