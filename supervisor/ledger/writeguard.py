"""Ledger writes that never take the daemon down.

A failed write (a full disk, an I/O error, a state dir deleted underneath) is counted, said once
per episode, and dropped; supervision goes on. The episode ends after :data:`RECOVERED_AFTER_S`
of writes without a failure, with a line saying how many records were lost.
"""

from __future__ import annotations

import functools
import sqlite3
import threading
from pathlib import Path
from typing import Any, Callable, Concatenate, ParamSpec, Protocol, TypeVar

from .errors import LedgerError

# A nearly full disk lets small writes through between failures: one success does not end the
# episode (that would say "recovered" and "failed" again for every few records).
RECOVERED_AFTER_S = 30.0


def logger() -> Any:
    """The ledger's logger (its write failures, its checkpoint thread), made at first use."""
    import structlog

    return structlog.get_logger("supervisor.ledger.store")


class WriteHealth:
    """How the ledger's writes are going: writes dropped since the daemon started, and the
    failure episode in progress. Written by every thread that writes the ledger (the main loop,
    the launch-preparation worker), so under a lock: an episode is said exactly once."""

    def __init__(self, path: Path, monotonic: Callable[[], float]) -> None:
        self.path = path
        self.monotonic = monotonic  # injectable: tests end an episode without waiting 30 s
        self.errors = 0  # writes dropped since the daemon started
        self.lost_in_episode = 0
        self.failing: str | None = None  # the error of the episode in progress
        self.ok_since: float | None = None  # writes have succeeded since (monotonic), while failing
        self._lock = threading.Lock()

    def failed(self, e: Exception) -> None:
        with self._lock:
            self.errors += 1
            self.lost_in_episode += 1
            self.ok_since = None
            if self.failing is not None:
                return
            self.failing = str(e)
        logger().error("ledger_write_failed", error=str(e), path=str(self.path),
                     message=f"the ledger {self.path} cannot be written ({e}): supervision continues, "
                             "records are dropped and counted until it can (said once per episode; "
                             "status shows ledger_write_errors)")

    def succeeded(self) -> None:
        if self.failing is None:  # the common case, without the lock: nothing to end
            return
        with self._lock:
            if self.failing is None:
                return
            now = self.monotonic()
            if self.ok_since is None:
                self.ok_since = now
            if now - self.ok_since < RECOVERED_AFTER_S:
                return
            lost, error = self.lost_in_episode, self.failing
            self.failing = None
            self.lost_in_episode = 0
        logger().warning("ledger_write_recovered", lost=lost, path=str(self.path),
                       message=f"the ledger can be written again; {lost} record(s) were lost while it could not "
                               f"({error})")


def is_busy(e: BaseException) -> bool:
    """Another connection holds the write lock (SQLITE_BUSY or SQLITE_LOCKED, extended codes too)."""
    return isinstance(e, sqlite3.OperationalError) and (getattr(e, "sqlite_errorcode", 0) & 0xFF) in (5, 6)


class Keeper(Protocol):
    """Where a write that met another process's lock waits (deferred.DeferredWrites)."""

    @property
    def waiting(self) -> int: ...

    def keep(self, write: Callable[[], object], error: BaseException | None) -> None: ...


class Guarded(Protocol):
    health: WriteHealth

    @property
    def deferred(self) -> Keeper | None:
        """The writer's keeper; None for a read-only ledger."""


G = TypeVar("G", bound=Guarded)
P = ParamSpec("P")
R = TypeVar("R")


def guarded(fn: Callable[Concatenate[G, P], R]) -> Callable[Concatenate[G, P], R | None]:
    """``fn``, a write of the ledger, made one that never raises a database or OS error: the
    failure goes to the ledger's :class:`WriteHealth` and the write returns None."""

    @functools.wraps(fn)
    def write(self: G, /, *a: P.args, **kw: P.kwargs) -> R | None:
        keeper = self.deferred
        if keeper is not None and keeper.waiting:  # behind the writes waiting for a lock, in order
            keeper.keep(lambda: fn(self, *a, **kw), None)
            return None
        try:
            result = fn(self, *a, **kw)
        except (sqlite3.Error, OSError, LedgerError) as e:  # LedgerError: a read-only ledger's refusal
            if keeper is not None and is_busy(e):
                keeper.keep(lambda: fn(self, *a, **kw), e)  # another process holds the lock: later, not lost
            else:
                self.health.failed(e)
            return None
        self.health.succeeded()
        return result

    return write
