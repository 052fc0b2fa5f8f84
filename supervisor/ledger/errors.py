"""The ledger's one error kind, apart from the store so its readers (history.py, the CLI) can
name it without importing the store."""

from __future__ import annotations

from ..errors import SupervisorError


class LedgerError(SupervisorError):
    """The ledger file cannot be used: corrupt, not a ledger, or written by a newer version."""

    code = "ledger"
