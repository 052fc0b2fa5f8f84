"""The CLI's read-only open of a ledger (``history``, ``status`` after the run, ``logs``, ``report``,
``checkpoints``): the file is looked at before SQLite opens it.

SQLite opens by name, follows a link and waits, uninterruptibly (it retries EINTR, so not even
Ctrl-C ends it), on a FIFO; a folder there fails as "disk I/O error". So ``ledger.sqlite`` (and
the ``-wal``, ``-shm`` and ``-journal`` files SQLite opens beside it) must be a regular file,
never followed through a link (:mod:`supervisor.regularfile`); anything else is a LedgerError that
says what is there ("ledger.sqlite is a FIFO, not a ledger"). A name swapped between the look and
SQLite's open is caught by comparing what was opened with what was checked (device, inode).
"""
from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from urllib.parse import quote

from ..ownpaths import file_identity
from ..regularfile import NotARegularFile, check_regular
from .errors import LedgerError, unusable

SIDE_FILES = ("-wal", "-shm", "-journal")


def _read_only_fs(folder: Path) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def open_read_only(path: Path, timeout: float) -> sqlite3.Connection:
    """A read-only connection to the ledger at ``path``. FileNotFoundError when there is none,
    LedgerError when what is there is no regular file or cannot be opened."""
    try:
        ident = check_regular(path, "a ledger")
        for suffix in SIDE_FILES:  # absent is fine: SQLite makes -shm when it needs one
            try:
                check_regular(f"{path}{suffix}", f"the ledger's {suffix[1:]} file")
            except (FileNotFoundError, PermissionError):
                continue  # (another user's -shm: SQLite itself says what stops it)
    except FileNotFoundError:
        raise FileNotFoundError(f"no ledger at {path}: no run has used this state dir") from None
    except NotARegularFile as e:
        raise LedgerError(e.message) from None
    except OSError as e:
        raise LedgerError(f"the ledger {path} cannot be read ({e.strerror}): run as a user that may "
                          "read the state dir (the daemon's), or use another state dir") from None
    # On a read-only mount SQLite cannot make the -shm file a WAL ledger is read through; nobody
    # can change the file there either, so it is read as immutable (no -shm needed). The path is
    # quoted: a "?" or "#" in a folder's name would end the URI's path.
    frozen = "&immutable=1" if _read_only_fs(path.parent) else ""
    try:
        db = sqlite3.connect(f"file:{quote(str(path))}?mode=ro{frozen}", uri=True, timeout=timeout)
    except sqlite3.Error as e:
        raise LedgerError(unusable(path, e)) from None
    if file_identity(path) != ident:
        db.close()
        raise LedgerError(f"the ledger {path} was replaced while it was being opened; run the command again")
    return db
