"""Strict JSON for everything the project writes: no bare ``NaN`` / ``Infinity`` tokens.

Python's ``json`` writes a non-finite float as ``NaN``, ``Infinity`` or ``-Infinity``, which is not
JSON: a browser's ``JSON.parse``, ``jq`` and Go's decoder reject the whole document. The rule,
one for every JSON output (``history --json``, ``status --json``, ``checkpoints --json``, control
replies, ledger columns, manifests, report data, journal fields):

    a non-finite number is written as the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``.

A string, not ``null``: a NaN loss is the evidence of a ``nan`` detection and must stay visible as
NaN. Those three spellings are the ones both Python's ``float()`` and JavaScript's ``Number()``
read back as the number. Readers of files written before this rule keep working: ``json.loads``
accepts the bare tokens; :func:`number` turns either form back into a float.

Pure and stdlib only: the core, the client library and the daemon all use it.
"""
from __future__ import annotations

import json
import math
from typing import IO, Any, Callable

__all__ = ["NON_FINITE", "dump", "dumps", "finite", "number"]

#: the string written for each non-finite value; float() and JS Number() read each one back
NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def _spell(v: float) -> str:
    return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")


def finite(value: Any) -> Any:
    """``value`` with every non-finite float (in dicts, lists and tuples, keys included)
    replaced by its string; everything else as it was (tuples become lists, as JSON would)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else _spell(value)
    if isinstance(value, dict):
        return {(_spell(k) if isinstance(k, float) and not math.isfinite(k) else k): finite(v)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def _default(user: Callable[[Any], Any] | None) -> Callable[[Any], Any] | None:
    # What a caller's ``default`` returns for an unknown object is encoded next: it goes through
    # the same conversion, so no path lets a bare NaN through (allow_nan=False would raise).
    if user is None:
        return None
    return lambda o: finite(user(o))


def dumps(value: Any, *, default: Callable[[Any], Any] | None = None, **kw: Any) -> str:
    """``json.dumps`` that never writes a bare NaN/Infinity (see the module doc for the rule)."""
    return json.dumps(finite(value), allow_nan=False, default=_default(default), **kw)


def dump(value: Any, fp: IO[str], *, default: Callable[[Any], Any] | None = None, **kw: Any) -> None:
    """``json.dump`` under the same rule as :func:`dumps`."""
    json.dump(finite(value), fp, allow_nan=False, default=_default(default), **kw)


def number(value: Any) -> Any:
    """A value read back from our JSON: ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (and the
    lower-case ``"nan"``, ``"inf"``, ``"-inf"``) become the float; anything else is returned as is."""
    if isinstance(value, str) and value.strip().lower() in ("nan", "infinity", "-infinity", "inf", "-inf", "+inf"):
        return float(value)
    return value
