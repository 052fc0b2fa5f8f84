"""The daemon's ledger checkpoints its WAL on a thread of its own, never on the main loop.

SQLite checkpoints a WAL database inside the commit that takes the WAL past 1000 pages: that
commit copies the WAL into the file and fsyncs it. Under a metric flood it was one write in ~100
of the loop's metric batches, 54-93 ms each, and the control replies that waited behind them
were the ones over 100 ms (bench_core control). Here the writer's connection checkpoints nothing
(``wal_autocheckpoint=0``) and a connection of this thread runs PASSIVE checkpoints: they never
block the writer nor wait for it (frames still in use are left for the next round), and the
sqlite3 module lets go of the GIL while one runs.

Rules, each for a reason:
- Only the file the ledger holds open is checkpointed: before each round the file at the path
  must be the one the writer writes (its identity), so a state dir deleted under the daemon and
  re-created (the ledger's retake) is followed, and nothing is ever created at the path
  (``mode=rw``: a missing file is an error, not a new empty ledger).
- Any doubt -> the writer's own checkpoints again. A round that fails with an SQLite error is
  tried again at the next one (a state dir deleted for a moment); :data:`GIVE_UP_AFTER` failed
  rounds in a row, or any other error, and ``fallback`` turns SQLite's auto-checkpoint back on
  for the writer and this thread ends: the WAL never grows without bound because of it.
"""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..ownpaths import file_identity
from .writeguard import logger

GIVE_UP_AFTER = 60  # failed rounds in a row (~a minute) before the writer checkpoints again


@dataclass(frozen=True)
class Round:
    """One checkpoint round: WAL frames at its start and how many are now in the file, or why
    none ran (``skipped``: nothing to do, or the file at the path is not the ledger's)."""

    frames: int = 0
    copied: int = 0
    skipped: str | None = None


class WalCheckpointer:
    """PASSIVE checkpoints of the ledger at ``path`` every ``interval_s`` on a thread
    (``ledger-checkpoint``); ``ident`` gives the (device, inode) of the file the writer holds."""

    def __init__(self, path: Path, ident: Callable[[], tuple[int, int] | None],
                 fallback: Callable[[], None], *, interval_s: float) -> None:
        self.path, self.ident, self.fallback, self.interval_s = path, ident, fallback, interval_s
        self._conn: sqlite3.Connection | None = None
        self._conn_ident: tuple[int, int] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failed_rounds = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ledger-checkpoint", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """End the thread and close its connection (before the writer's, whose close is then the
        last one: SQLite checkpoints and removes the WAL there)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if self._thread is None or not self._thread.is_alive():
            self._close()

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval_s):
                try:
                    self.round()
                    self.failed_rounds = 0
                except sqlite3.Error as e:
                    self._close()  # the next round opens the file again (it may be re-created)
                    self.failed_rounds += 1
                    if self.failed_rounds >= GIVE_UP_AFTER:
                        self._give_up(f"{GIVE_UP_AFTER} checkpoint rounds in a row failed, the last with: {e}")
                        return
        except Exception as e:  # a defect here must not leave the WAL unchecked: the writer takes over
            self._give_up(f"the checkpoint thread failed: {type(e).__name__}: {e}")
        finally:
            self._close()

    def _give_up(self, why: str) -> None:
        self.fallback()
        logger().warning("ledger_checkpoint_fallback", path=str(self.path), reason=why,
                       next="the daemon's own ledger writes checkpoint the WAL again (SQLite's default); "
                            "supervision continues")

    def round(self) -> Round:
        """One PASSIVE checkpoint of the ledger's file, now (the thread's body; tests call it)."""
        want = self.ident()
        if want is None or file_identity(self.path) != want:
            self._close()
            return Round(skipped="the file at the ledger's path is not the one the daemon writes")
        if self._conn is None or self._conn_ident != want:
            self._close()
            self._conn = sqlite3.connect(f"file:{self.path}?mode=rw", uri=True, isolation_level=None,
                                         check_same_thread=False, timeout=0)
            self._conn_ident = want
            if file_identity(self.path) != want:  # replaced between the look and the open
                self._close()
                return Round(skipped="the ledger's file was replaced while it was opened")
        busy, frames, copied = self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        if frames <= 0:
            return Round(skipped="no WAL frames to copy")
        return Round(frames=frames, copied=copied)

    def _close(self) -> None:
        conn, self._conn, self._conn_ident = self._conn, None, None
        if conn is not None:
            try:
                conn.close()
            except sqlite3.Error:
                pass  # its file is gone: nothing is left to write into it
