"""The metadata every config field carries: its one-line help (the generated reference) and its
constraints, read by :func:`supervisor.config.schema.build`. A leaf (stdlib only): the concerns'
tables and the core's (:mod:`supervisor.core.settings`) declare their fields with it, below the
config model that composes them.
"""

from __future__ import annotations

from typing import Any, Callable

Check = Callable[[Any], "str | None"]


def meta(
    help: str,
    *,
    min: float | None = None,
    max: float | None = None,
    choices: tuple[str, ...] | None = None,
    check: Check | None = None,
    min_exclusive: bool = False,
) -> dict[str, Any]:
    """Field metadata: the one-line help (documents the key) and its constraints."""
    return {
        "help": help,
        "min": min,
        "max": max,
        "choices": choices,
        "check": check,
        "min_exclusive": min_exclusive,
    }
