"""Numbers as people read them: byte sizes and durations (the CLI, status, checkpoint listings),
and the one spelling of a value in every output (:func:`value`). Text the job or the filesystem
chose is escaped by :mod:`supervisor.textescape`."""
from __future__ import annotations

import enum
from typing import Any

from . import strictjson


def size(n: Any) -> str:
    """``512 B``, ``1.5 KiB``, ... ``3.2 TiB``; a value that is not a number is shown as it is."""
    try:
        v = float(n)
    except (TypeError, ValueError):
        return str(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if v < 1024:
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return f"{v:.1f} TiB"


def duration(seconds: float) -> str:
    """``0.4 s``, ``12 s``, ``4 min 05 s``, ``3 h 12 min``, ``2 d 04 h``."""
    s = max(0.0, float(seconds))
    if s < 10:
        return f"{s:.1f} s"
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        m, r = divmod(int(round(s)), 60)
        return f"{m} min {r:02d} s"
    if s < 86400:
        h, r = divmod(int(round(s)) // 60, 60)
        return f"{h} h {r:02d} min"
    d, r = divmod(int(round(s)) // 3600, 24)
    return f"{d} d {r:02d} h"


def value(v: Any) -> str:
    """A value as every output spells it: logfmt lines, the console's compact lines, journal
    fields, the demo's summary, the report. Booleans ``true``/``false``, an enum by its value,
    lists and dicts as compact JSON (``["python","train.py"]``, a NaN inside as ``"NaN"``: strict
    JSON), numbers as Python writes them (``0.523``, ``nan``), None as nothing. Never a Python repr
    (``True``, ``{'crash': 9.3}``): one reader, one parser, whatever the output."""
    if v is None:
        return ""
    if isinstance(v, enum.Enum):
        v = v.value
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (set, frozenset)):
        v = sorted(v, key=str)
    if isinstance(v, (list, tuple, dict)):
        return strictjson.dumps(v, default=str, separators=(",", ":"))
    return str(v)


def durations_by(mapping: Any) -> str:
    """``{"crash": 9.3, "nan": 74.2}`` -> ``nan 1 min 14 s, crash 9.3 s``: seconds by name in words
    and units (:func:`duration`), largest first; anything else spelled by :func:`value`."""
    if not isinstance(mapping, dict):
        return value(mapping)
    nums = {k: float(v) for k, v in mapping.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    rest = [f"{k} {value(v)}" for k, v in mapping.items() if k not in nums]
    return ", ".join([f"{k} {duration(v)}" for k, v in sorted(nums.items(), key=lambda kv: -kv[1])] + rest)

