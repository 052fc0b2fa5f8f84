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
# tried again from inside it); a bare non-finite word (not part of a longer word or a number), MSVC's
# spellings too (``-nan(ind)``, ``1.#QNAN``, ``-1.#INF00``: a Windows job's printf); a bare Python
# constant; a comma before a closing bracket (``{"loss": nan, }``: a hand-written line's trailing
# comma, dropped; its lookahead scans only the blanks after that one comma: linear).
_TOKEN = re.compile(r'("[^"\\]*(?:\\.[^"\\]*)*"?)'
                    r"|(?<![\w.#])([-+]?)((?i:nan\((?:ind|snan)\)|1\.#(?:qnan|snan|ind|inf)\d*|nan|inf(?:inity)?))(?![\w.])"
                    r"|(?<![\w.])(True|False|None)(?![\w.])"
                    r"|(,)(?=\s*[}\]])", re.DOTALL)
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
        low = word.lower()
        if low[0] == "n" or (low[0] == "1" and not low.startswith("1.#inf")):
            return "NaN"
        return "-Infinity" if m.group(2) == "-" else "Infinity"
    if m.group(5) is not None:
        return ""  # a trailing comma
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


# A string (as _TOKEN reads one) or a brace: what finding an object's closing brace looks at.
_SCAN = {'"': re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[{}]'), "'": re.compile(r"'[^'\\]*(?:\\.[^'\\]*)*'?|[{}]")}


def object_end(line: str, start: int, quote: str = '"') -> int:
    """The end (one past its closing ``}``) of the object that opens at ``line[start]``, braces in
    strings (``quote``: ``"`` JSON's, ``'`` a Python dict's) not counted; -1 when it never closes.
    One pass, linear in the line: each string is skipped whole, nesting is a counter."""
    depth = 0
    for m in _SCAN[quote].finditer(line, start):
        c = m.group()
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return m.end()
    return -1


def embedded_object(line: str, quote: str = '"') -> str | None:
    """The balanced ``{...}`` object of a line that holds one with text before and/or after it
    (``2024-01-01 INFO {"step": 8, "loss": nan} rank=0``, ``{"loss": nan} (12.3 it/s)``): its
    first ``{"`` (``{'`` for ``quote="'"``) to the brace that closes it; None when there is none or
    it never closes."""
    i = line.find("{" + quote)
    if i < 0:
        return None
    end = object_end(line, i, quote)
    return line[i:end] if end > 0 else None


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


def unread_reason(line: str, max_chars: int, embedded: bool = False) -> str | None:
    """Why ``line``, which starts like a JSON metric record (:func:`json_start`, a loss-like key in
    its first :data:`HEAD_CHARS`), gave no record; None for a line that does not start like one,
    or that reads (the caller's parser had no record from it for another reason). ``embedded``: the
    caller's parser reads a balanced object with text around it (:func:`embedded_object`, a job's
    output line), so that object is what is judged; else (a JSONL file's line) the line from its ``{"``."""
    obj_text = embedded_object(line) if embedded and len(line) <= max_chars else None
    i = json_start(line) if obj_text is None else line.find('{"')
    if i < 0 or not loss_keyed(line[i:i + HEAD_CHARS]):
        return None
    if len(line) > max_chars:
        return f"longer than {max_chars} characters: not parsed"
    text = line[i:].strip() if obj_text is None else obj_text
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


__all__ = ["HEAD_CHARS", "embedded_object", "json_start", "object_end", "loss_keyed", "python_spelled", "unread_reason"]
