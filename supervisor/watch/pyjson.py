"""JSON-shaped metric lines with Python's spellings of values, and the JSON-shaped lines that
still give no record (so that none is dropped unsaid).

A job that prints its metrics with an f-string, ``print(f'{{"step": {s}, "loss": {loss}}}')``,
writes ``{"step": 20, "loss": nan}`` once the loss is NaN: ``str(float)`` is ``nan``, ``inf``,
``-inf``, where JSON (and ``json.dumps``) says ``NaN``, ``Infinity``. Such a line is no JSON, and
was dropped unseen: the run ended "finished, watched" over a NaN model. :func:`python_spelled`
reads it. Callers try ``json.loads`` first (every valid line takes that path, unchanged); only a
line it refuses comes here, and is decoded once more with its bare words outside strings, at any
depth, rewritten to JSON's: ``nan``, ``-nan``, ``inf``, ``-inf``, ``infinity`` in any case (a NaN's
sign dropped: JSON has no ``-NaN``), and Python's ``True``, ``False``, ``None``. One pass, linear in
the line: a string is matched from its quote to its closing quote or the line's end, never tried
again from inside it; nesting is bounded by the decoder's own limit (``RecursionError``: not read).
The line lengths are the callers' bounds (``[detectors.parsers] max_line_chars`` for output lines,
``readbounds.MAX_RECORD_LINE`` for a JSONL file's).

:func:`unread_reason` says why a line that starts like a JSON metric record (an object with a
loss-like key: ``loss``, ``train/loss``, ``grad_norm``, ...) gave none: not JSON even so
(``tensor(nan)`` printed into it), too long to parse, nested past the decoder, or a loss value that
is no number. The log watcher counts such lines per source and says them (:mod:`.unparsed`).
Pure functions.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping

from .records import LOSS_FIELDS, field_of, to_float

# A string (its closing quote optional: an unterminated one ends the line, so no match fails and is
# tried again from inside it); a bare non-finite word (not part of a longer word or a number); a
# bare Python constant.
_TOKEN = re.compile(r'("[^"\\]*(?:\\.[^"\\]*)*"?)'
                    r"|(?<![\w.])([-+]?)((?i:nan|inf(?:inity)?))(?![\w.])"
                    r"|(?<![\w.])(True|False|None)(?![\w.])", re.DOTALL)
_CONSTANTS = {"True": "true", "False": "false", "None": "null"}
# Keys looked for in a line's head: "name": (escapes and long names are no metric key).
_KEY = re.compile(r'"([^"\\]{1,64})"\s*:')
#: How much of a line's start is searched for a loss-like key.
HEAD_CHARS = 4096


def _spelled(m: re.Match[str]) -> str:
    if m.group(1) is not None:
        return m.group(1)  # a string: as written
    word = m.group(3)
    if word is not None:
        if word[0] in "nN":
            return "NaN"
        return "-Infinity" if m.group(2) == "-" else "Infinity"
    return _CONSTANTS[m.group(4)]


def python_spelled(text: str | bytes) -> dict[str, Any] | None:
    """The JSON object ``text`` holds once Python's bare ``nan`` / ``inf`` / ``-inf`` (any case),
    ``True`` / ``False`` / ``None`` outside strings are read as JSON's; None when it is still no
    JSON object (or nests deeper than the decoder goes). For a line ``json.loads`` refused."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    fixed = _TOKEN.sub(_spelled, text)
    if fixed == text:
        return None  # nothing to read differently: json.loads already said no
    try:
        obj = json.loads(fixed)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def loss_keyed(head: str) -> bool:
    """Whether ``head`` (a line's start) names a loss-like key: ``"loss":``, ``"train/loss":``,
    ``"grad_norm":`` (:func:`.records.field_of`)."""
    low = head.lower()
    if "oss" not in low and "norm" not in low:  # every loss-like key holds one: most lines end here
        return False
    return any(field_of(m.group(1)) in LOSS_FIELDS for m in _KEY.finditer(head))


def json_start(line: str) -> int:
    """Where the JSON object a line is read as starts (the line's first ``{"``): at the line's start
    (after blanks), or behind a prefix (a logging prefix, ``[rank0]:``) on a line that ends with
    ``}``; -1 for any other line."""
    i = line.find('{"')
    if i < 0 or (i and line[:i].strip() and not line.rstrip().endswith("}")):
        return -1
    return i


def _bad_loss(d: Mapping[str, Any]) -> str | None:
    """A loss-like key of ``d`` (or of a dict in it, as :func:`.records.record_from_mapping`
    reads them) whose value is text that is no number: ``"loss": "tensor(nan)"``."""
    for key, raw in d.items():
        inner = raw.items() if isinstance(raw, dict) else ((None, raw),)
        for sub, value in inner:
            name = key if sub is None else f"{key}/{sub}"
            if isinstance(value, str) and field_of(name) in LOSS_FIELDS and to_float(value) is None:
                return name
    return None


def unread_reason(line: str, max_chars: int) -> str | None:
    """Why ``line``, which starts like a JSON metric record (:func:`json_start`, a loss-like key in
    its first :data:`HEAD_CHARS`), gave no record; None for a line that does not start like one,
    or that reads (the caller's parser had no record from it for another reason)."""
    i = json_start(line)
    if i < 0 or not loss_keyed(line[i:i + HEAD_CHARS]):
        return None
    if len(line) > max_chars:
        return f"longer than {max_chars} characters: not parsed"
    text = line[i:].strip()
    try:
        obj = json.loads(text)
    except ValueError:
        try:  # Python's spellings read as JSON's: what is wrong is what is left
            obj = json.loads(_TOKEN.sub(_spelled, text))
        except RecursionError:
            return "nested deeper than the JSON decoder goes"
        except ValueError as exc:
            return f"not JSON, even with Python's nan/inf read as numbers ({getattr(exc, 'msg', None) or exc})"
    except RecursionError:
        return "nested deeper than the JSON decoder goes"
    if not isinstance(obj, dict):
        return None
    bad = _bad_loss(obj)
    return f"its {bad} is text that is no number" if bad is not None else None


__all__ = ["HEAD_CHARS", "json_start", "loss_keyed", "python_spelled", "unread_reason"]
