"""The ledger's one error kind and its messages, apart from the store so its readers (history.py,
the CLI) can name it without importing the store."""

from __future__ import annotations

from pathlib import Path

from ..errors import SupervisorError


class LedgerError(SupervisorError):
    """The ledger file cannot be used: corrupt, not a ledger, or written by a newer version."""

    code = "ledger"


def unusable(path: Path, e: Exception) -> str:
    """An OperationalError says what stops us (lock, permissions, read-only), not that the file is bad."""
    text = str(e).lower()
    if "locked" in text or "busy" in text:
        return (f"the ledger {path} is locked by another process ({e}): another daemon or a tool "
                "(an sqlite3 shell, a backup) holds it. Stop that process and start again, or use another state dir")
    if "full" in text:  # SQLITE_FULL: "database or disk is full"; the file is fine, the disk is not
        return (f"the ledger {path} cannot be written: the disk holding it is full ({e}). Free space on "
                "that filesystem and start again, or use another state dir; the ledger is left as it was")
    if "readonly" in text or "read-only" in text or "unable to open" in text or "permission" in text:
        return (f"the ledger {path} cannot be opened for writing ({e}): the state dir or the ledger is "
                "read-only. Make it writable by the daemon (permissions, a read-only mount), or use another state dir")
    return corrupt(path, e)


def corrupt(path: Path, e: Exception) -> str:
    return (f"the ledger {path} cannot be read ({e}): it is corrupt or not a ledger. Move it aside "
            "(the run's history is in it) and start again, or use another state dir")
