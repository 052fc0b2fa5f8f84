"""Ledger writes that wait for another process's lock without making the daemon wait.

An sqlite3 shell, a backup or a tool holding ``BEGIN EXCLUSIVE`` on the ledger used to hold each
write of the main loop for the whole busy wait (10 s), so a ``stop`` took 20 s and more. The
daemon's writer now waits :data:`WRITE_WAIT_S` at most; a write that meets the lock is kept here,
in order with every write after it, and retried on a thread of its own (``ledger-retry``) with
the wall time it was made at. Nothing is dropped unless :data:`MAX_WAITING` writes wait, or the
lock is still held when the daemon exits after :data:`CLOSE_WAIT_S`: those are counted and said
by the ledger's :class:`~supervisor.ledger.writeguard.WriteHealth` (``ledger_write_failed``).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections import deque
from typing import Callable

from .writeguard import WriteHealth, is_busy, logger

# How long one write may wait for the lock before it is kept for later: the bound on what the
# ledger costs the main loop (one such wait per episode; the writes behind it wait in memory).
WRITE_WAIT_S = 0.1
RETRY_S = 0.5  # how often the thread tries again
MAX_WAITING = 20_000  # writes kept while locked (~1 kB each, a metric batch more): past it, dropped and counted
CLOSE_WAIT_S = 10.0  # at the daemon's exit, how long the lock may still be waited for (the old per-write wait)


class DeferredWrites:
    """The ledger's writes that met another process's lock, oldest first, each with its time."""

    def __init__(self, health: WriteHealth, clock: Callable[[], float]) -> None:
        self.health = health
        self._clock = clock
        self._waiting: deque[tuple[Callable[[], object], float]] = deque()
        self._lock = threading.Lock()  # the queue
        self._replaying = threading.Lock()  # one replay at a time (the thread, or close)
        self._pinned = threading.local()  # the time a replayed write was made at, on the replaying thread
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._delayed = 0  # writes kept in the episode in progress

    def now(self) -> float:
        """The ledger's clock: on a replay, the time the write was made at."""
        at = getattr(self._pinned, "at", None)
        return self._clock() if at is None else at

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def keep(self, write: Callable[[], object], error: BaseException | None) -> None:
        """Keep ``write`` (made now) for later; ``error``: the lock it met (None: it queued behind others)."""
        at = self._clock()
        first = False
        with self._lock:
            if len(self._waiting) >= MAX_WAITING:
                full = True
            else:
                full = False
                self._waiting.append((write, at))
                self._delayed += 1
                first = self._delayed == 1
        if full:  # said once per episode by the health, and counted
            self.health.failed(sqlite3.OperationalError(
                f"database is locked, and {MAX_WAITING} writes already wait for it: this one is dropped"))
            return
        if first:
            logger().warning("ledger_write_delayed", error=str(error), path=str(self.health.path),
                             message=f"the ledger {self.health.path} is locked by another process ({error}): its "
                                     f"writes wait in memory (up to {MAX_WAITING}) and are retried every {RETRY_S:g} s; "
                                     "supervision goes on. Release the lock (an sqlite3 shell, a backup) to let them in")
        self._start_thread()

    def _start_thread(self) -> None:
        with self._lock:
            if self._thread is not None or self._stop.is_set():
                return
            self._thread = threading.Thread(target=self._run, name="ledger-retry", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(RETRY_S):
            if self.replay():
                with self._lock:
                    if not self._waiting:  # none came in since: the thread ends, the next lock starts one
                        self._thread = None
                        return

    def replay(self) -> bool:
        """Write what waits, oldest first, until the lock is met again; True when none is left."""
        with self._replaying:
            while True:
                with self._lock:
                    if not self._waiting:
                        break
                    write, at = self._waiting[0]
                self._pinned.at = at
                try:
                    write()
                except Exception as e:  # a replay never raises: the lock waits, the rest is counted
                    if is_busy(e):
                        return False
                    self.health.failed(e)
                else:
                    self.health.succeeded()
                finally:
                    self._pinned.at = None
                with self._lock:
                    self._waiting.popleft()
            with self._lock:
                delayed, self._delayed = self._delayed, 0
        if delayed:
            logger().info("ledger_write_recovered", lost=0, delayed=delayed, path=str(self.health.path),
                          message=f"the ledger is no longer locked: the {delayed} write(s) that waited for it are in")
        return True

    def close(self, wait_s: float | None = None) -> None:
        """Stop the thread; write what waits, for ``wait_s`` (:data:`CLOSE_WAIT_S`) at most; count
        what still cannot be."""
        wait_s = CLOSE_WAIT_S if wait_s is None else wait_s
        self._stop.set()
        with self._lock:
            t = self._thread
        if t is not None:
            t.join()
        deadline = time.monotonic() + wait_s  # real time: a test's injected clock may never move
        pause = threading.Event()  # never set: a wait between two tries
        while not self.replay() and time.monotonic() < deadline:
            pause.wait(min(RETRY_S, max(0.0, deadline - time.monotonic())))
        with self._lock:
            lost = len(self._waiting)
            self._waiting.clear()
        for _ in range(lost):
            self.health.failed(sqlite3.OperationalError(
                f"database is locked: still held by another process when the daemon exited ({lost} write(s) lost)"))
