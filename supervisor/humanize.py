"""Numbers as people read them: byte sizes and durations (the CLI, status, checkpoint listings)."""
from __future__ import annotations

from typing import Any


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
