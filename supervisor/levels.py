"""How much an event matters: one closed set, read by the log line (the structlog method), the
journal's PRIORITY, the ledger's ``level`` column and ``history``. A leaf (stdlib only): the core
records with it, so it must not pull logging's machinery into the core's import closure.
"""

from __future__ import annotations

from enum import StrEnum


class Level(StrEnum):
    """A member is its lower-case name, so a ``str`` level already stored or sent reads the same."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"
    CRITICAL = "critical"

    @property
    def number(self) -> int:
        """The stdlib logging level (10 .. 50) that structlog's filtering logger dispatches on."""
        return (list(Level).index(self) + 1) * 10
