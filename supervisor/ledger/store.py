"""The run ledger: SQLite in the state dir, the memory of every run, attempt and event.

Written by the daemon (its main loop and the launch-preparation worker, through one locked
connection: connection.py); read by the CLI (``history``) through its own read-only connection. WAL mode keeps readers from blocking the writer. A daemon restarted after
``kill -9`` reopens the same file, finds the unfinished run and continues it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from ..ownpaths import file_identity, open_in
from .connection import CheckedReads, LockedConnection
from .deferred import WRITE_WAIT_S, DeferredWrites
from .errors import LedgerError, corrupt, unusable
from .history import history_of, repeat_of
from .readopen import open_read_only
from .runstates import FINAL_STATES, IN_PROGRESS
from .schema import LEDGER_FILE, MIGRATIONS, SCHEMA, SCHEMA_VERSION
from .walcheckpoint import WalCheckpointer
from .writeguard import WriteHealth, guarded
from .. import strictjson
from ..redact import redact_argv, redact_data, redact_text

__all__ = ["AttemptRow", "Ledger", "LedgerError"]


def _numbers_json(rows: list[tuple[Any, ...]]) -> str:
    """Rows of numbers (or None) as JSON that SQLite reads back as the same values: NaN becomes
    null (SQLite stores a bound NaN as NULL too) and an infinity 1e999 (read back as infinity).
    The rows hold numbers only, so the text replacement cannot touch anything else."""
    text = json.dumps([[None if isinstance(v, float) and math.isnan(v) else v for v in r] for r in rows])
    return text.replace("-Infinity", "-1e999").replace("Infinity", "1e999")


def _json(v: Any) -> str | None:  # through the redaction gate: a row may leave the node (history, reports)
    return None if v is None else strictjson.dumps(redact_data(v), default=str, sort_keys=True)


@dataclass(frozen=True)
class AttemptRow:
    attempt: int
    argv: list[str]
    cwd: str
    started_at: float
    ended_at: float | None
    pid: int | None
    pgid: int | None
    leader_ctime: float | None
    exit_code: int | None
    signal: str | None
    cause: str | None
    action: str | None
    checkpoint: str | None
    counted: bool
    resume_step: int | None
    repeat: dict[str, Any] | None = None  # policy.RepeatKey's fields, for a failure that has one
    progressed: bool = False


def _create(path: Path, flags: int) -> int:
    """Open ``path`` 0600 in its folder, opened first without following a link (ownpaths.open_in):
    a link at the file's name or swapped in for the folder cannot redirect the create."""
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return open_in(dfd, path.name, flags, 0o600)
    finally:
        os.close(dfd)


class Ledger:
    # How long a statement waits for another process's lock (an sqlite3 shell, a backup) before
    # the ledger says the file is locked; a class attribute so a test can wait less.
    BUSY_TIMEOUT_S = 10.0
    # How often the daemon's checkpoint thread looks at the WAL (walcheckpoint.py); a test waits less.
    CHECKPOINT_INTERVAL_S = 1.0

    def __init__(self, state_dir: Path, *, readonly: bool = False, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.path = state_dir / LEDGER_FILE
        # Wall time, only ever *recorded* (every row's time comes from it): order comes from the
        # rowid (see open_run).
        self.clock = clock
        self.health = WriteHealth(self.path, monotonic)  # what @guarded writes do on a failure
        self._ident: tuple[int, int] | None = None
        self._checkpointer: WalCheckpointer | None = None
        self.deferred: DeferredWrites | None = None  # the writer's writes that wait for a lock
        self._brief = False
        self.continued_config: Any = None  # open_run: the config table a continued run was last started with
        if readonly:
            # Only a regular file, never through a link, a FIFO never opened (readopen.py).
            self.db = self._checked(open_read_only(self.path, self.BUSY_TIMEOUT_S), self._check_readable)
            if self._not_made_yet(self.db):
                # A daemon creates the file, then its tables: a reader in between (`history`, `logs`,
                # `report` at the daemon's start) reads a ledger with no run yet, through every
                # query, instead of "no such table" from whichever it makes first.
                self.db.close()
                self.db = sqlite3.connect(":memory:")
                self.db.executescript(SCHEMA)
            # A page garbled after the open shows at the query that reads it: said as a
            # LedgerError naming the file and what to do, never a bare sqlite3 traceback.
            self.db = CheckedReads(self.db, lambda e: LedgerError(unusable(self.path, e)))
        else:
            try:
                state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
                if not self.path.exists():  # 0600 from the start, whatever the umask
                    os.close(_create(self.path, os.O_WRONLY | os.O_CREAT))
            except OSError as e:
                raise LedgerError(f"cannot create the ledger {self.path}: {e.strerror}. The state dir must be "
                                  "writable by the daemon (check its permissions and that its filesystem is not "
                                  "mounted read-only), or use another state dir") from None
            # One connection shared by the main loop and the launch-preparation worker; every
            # statement is serialized by LockedConnection.
            self.db = self._checked(LockedConnection(self._connect()), self._migrate)
            self._ident = file_identity(self.path)  # the file we hold open (see retake)
            self.deferred = DeferredWrites(self.health, clock)
            self.clock = self.deferred.now  # a write replayed after a lock keeps the time it was made at
        self.db.row_factory = sqlite3.Row

    @property
    def write_errors(self) -> int:
        """Writes dropped since the daemon started (a full disk): ``status``'s ledger_write_errors."""
        return self.health.errors

    @property
    def failing(self) -> str | None:
        """The error of the write-failure episode in progress, or None while writes succeed."""
        return self.health.failing

    def _checked(self, db: Any, setup: Callable[[Any], None]) -> Any:
        """``db`` once ``setup`` accepted it; closed, and the failure said plainly, otherwise."""
        try:
            setup(db)
        except sqlite3.OperationalError as e:
            db.close()
            raise LedgerError(unusable(self.path, e)) from None
        except sqlite3.DatabaseError as e:
            db.close()
            raise LedgerError(corrupt(self.path, e)) from None
        except LedgerError:
            db.close()
            raise
        return db

    def _check_readable(self, db: Any) -> None:
        self._check_version(db.execute("PRAGMA user_version").fetchone()[0])
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if tables and "runs" not in tables:
            raise sqlite3.DatabaseError(f"an SQLite file with the tables {', '.join(sorted(tables))}, none of a ledger's")

    @staticmethod
    def _not_made_yet(db: Any) -> bool:
        """The file exists and holds nothing yet: no schema version, not one table (a file with
        other tables is no ledger, and its first query says so)."""
        return (db.execute("PRAGMA user_version").fetchone()[0] == 0
                and db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0)

    def _migrate(self, db: Any) -> None:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        self._check_version(version)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        # One transaction: the tables, every step's ALTERs and the new user_version land together or
        # not at all, so a kill between two ALTERs leaves the file at its old version (migrated again
        # by the next daemon), never half-migrated and refused as corrupt.
        steps = "".join(MIGRATIONS[v] + "\n" for v in range(version, SCHEMA_VERSION) if MIGRATIONS[v])
        try:
            db.executescript(f"BEGIN IMMEDIATE;\n{SCHEMA}\n{steps}PRAGMA user_version={SCHEMA_VERSION};\nCOMMIT;")
        except Exception:
            try:
                db.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # no transaction was left open
            raise

    def _check_version(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise LedgerError(f"the ledger {self.path} was written by a newer transformer-supervisor (schema "
                              f"version {version}, this one knows up to {SCHEMA_VERSION}); upgrade, or use "
                              "another state dir")

    def checkpoint_in_background(self) -> None:
        """The daemon's ledger: WAL checkpoints on a thread of their own (walcheckpoint.py), not
        inside whichever write of the main loop crosses SQLite's threshold."""
        if not isinstance(self.db, LockedConnection) or self._checkpointer is not None:
            return
        self._checkpointer = WalCheckpointer(self.path, lambda: self._ident, self._checkpoints_fall_back,
                                             interval_s=self.CHECKPOINT_INTERVAL_S)
        self._tune_writer()
        self._checkpointer.start()

    def _checkpoints_fall_back(self) -> None:
        self._checkpointer = None
        try:
            self.db.execute("PRAGMA wal_autocheckpoint=1000")  # SQLite's default
        except sqlite3.Error:
            pass  # the writes fail too: their guard says so

    def _tune_writer(self) -> None:
        """The writer's connection checkpoints nothing while the thread does, and once the run is
        open waits at most WRITE_WAIT_S for another process's lock (deferred.py keeps the write):
        per-connection settings, so a retake's new connection needs them again."""
        if self._checkpointer is not None:
            self.db.execute("PRAGMA wal_autocheckpoint=0")
        if self._brief:
            self.db.execute(f"PRAGMA busy_timeout={int(WRITE_WAIT_S * 1000)}")

    def close(self) -> None:
        if self.deferred is not None:
            self.deferred.close()  # what waits for a lock goes in now, or is counted as lost
        if self._checkpointer is not None:
            self._checkpointer.stop()  # its connection first: the writer's close is then the last
        self.db.close()

    def retake(self, run_id: str, name: str, config_json: Mapping[str, Any]) -> str:
        """Move the ledger into the state dir re-created after it was deleted (or replaced) under
        the daemon; what happened, as a clause for the daemon's event.

        The deleted file lives on while our connection holds it open (and the writes since the
        deletion went into it), so its pages are copied into a new file at the same path: nothing
        is lost. Where that copy fails, a fresh ledger holds this run's row from now on and the
        rows before are lost with the old dir. :class:`LedgerError` when no ledger can be made
        (the daemon then stops its job: it could record nothing)."""
        if not isinstance(self.db, LockedConnection):
            raise LedgerError("a read-only ledger is never moved")
        if file_identity(self.path) == self._ident:
            return "the ledger was still in place"  # only other files of the dir went
        try:
            moved = self._new_file()
            self.db.move_to(self._connect(), copy=True)
            self.db.execute("PRAGMA journal_mode=WAL")
            self._tune_writer()
            return f"the ledger was copied from the daemon's open handle on the deleted one, nothing lost{moved}"
        except sqlite3.Error as e:
            copy_error = e
        except OSError as e:
            raise LedgerError(f"cannot create the ledger {self.path} again: {e.strerror or e}") from None
        try:  # a partial copy is not a ledger: start again from an empty file
            for leftover in (self.path, Path(f"{self.path}-wal"), Path(f"{self.path}-shm")):
                leftover.unlink(missing_ok=True)
            moved = self._new_file()
            self.db.move_to(self._connect(), copy=False)
            self._migrate(self.db)  # WAL mode included
            self._tune_writer()
            self.db.execute("INSERT INTO runs(run_id, name, created_at, state, config_json) VALUES (?,?,?,?,?)",
                            (run_id, name, self.clock(), IN_PROGRESS, _json(config_json)))
        except sqlite3.Error as e:
            raise LedgerError(unusable(self.path, e)) from None
        except OSError as e:
            raise LedgerError(f"cannot create the ledger {self.path} again: {e.strerror or e}") from None
        return (f"the old ledger could not be copied ({copy_error}): a fresh ledger continues run {run_id}; "
                f"its attempts, events and metrics before now are lost with the old dir{moved}")

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=self.BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)

    def _new_file(self) -> str:
        """Create the ledger file 0600, never through a symlink; a file already at its name (put
        there by hand) is moved aside, never overwritten. The clause saying so, or ""."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        note = ""
        try:
            fd = _create(self.path, flags)
        except FileExistsError:
            stem = f"{self.path.name}.found-{int(self.clock())}"
            aside, n = self.path.with_name(stem), 0
            while os.path.lexists(aside):  # two in one second: os.rename would replace the first
                n += 1
                aside = self.path.with_name(f"{stem}-{n}")
            os.rename(self.path, aside)
            note = f"; a file found at {self.path} was moved aside to {aside.name}"
            fd = _create(self.path, flags)
        try:
            st = os.fstat(fd)
            self._ident = (st.st_dev, st.st_ino)
        finally:
            os.close(fd)
        return note

    # -- runs -----------------------------------------------------------------------------
    def open_run(self, name: str, config_json: Mapping[str, Any]) -> tuple[str, bool]:
        """Continue the newest unfinished run of this state dir, or start a new one.

        Returns (run_id, continued). Runs are ordered by their rowid (the insertion sequence;
        rows are never deleted), never by the wall-clock ``created_at``: a clock stepped back (or
        forward) between two daemon lives cannot make an older run look newer and start a second
        copy of the job. Wall times are recorded as read, and may be out of order after a step.

        Not a guarded write: without its run row nothing of the run could be recorded, so a
        failure is a :class:`LedgerError` saying why (a full disk), never a raw SQLite error."""
        try:
            row = self.db.execute("SELECT run_id, state, config_json FROM runs ORDER BY rowid DESC LIMIT 1").fetchone()
            if row is not None and row["state"] not in FINAL_STATES:
                with contextlib.suppress(ValueError):  # read before it is replaced: a changed command is said
                    self.continued_config = json.loads(row["config_json"] or "null")
                self.db.execute("UPDATE runs SET state=?, ended_at=NULL, exit_code=NULL, reason=NULL, "
                                "config_json=? WHERE run_id=?", (IN_PROGRESS, _json(config_json), row["run_id"]))
                run_id, continued = row["run_id"], True
            else:
                now = self.clock()
                run_id, continued = time.strftime("%Y%m%d-%H%M%S", time.localtime(now)) + "-" + uuid.uuid4().hex[:6], False
                self.db.execute("INSERT INTO runs(run_id, name, created_at, state, config_json) VALUES (?,?,?,?,?)",
                                (run_id, name, now, IN_PROGRESS, _json(config_json)))
            self._brief = True  # the run is open (a lock at the start was waited for): writes now wait briefly
            self._tune_writer()
        except sqlite3.OperationalError as e:
            raise LedgerError(unusable(self.path, e)) from None
        except sqlite3.DatabaseError as e:
            raise LedgerError(corrupt(self.path, e)) from None
        return run_id, continued

    @guarded
    def end_run(self, run_id: str, state: str, exit_code: int, reason: str) -> None:
        self.db.execute("UPDATE runs SET state=?, exit_code=?, reason=?, ended_at=? WHERE run_id=?",
                        (state, exit_code, reason, self.clock(), run_id))

    def run_config(self, run_id: str) -> dict[str, Any]:
        """The config a run was started (or last continued) with, as its table; {} if none."""
        row = self.db.execute("SELECT config_json FROM runs WHERE run_id=?", (run_id,)).fetchone()
        return json.loads(row["config_json"]) if row and row["config_json"] else {}

    def latest_run_id(self) -> str | None:
        row = self.db.execute("SELECT run_id FROM runs ORDER BY rowid DESC LIMIT 1").fetchone()
        return row["run_id"] if row else None

    # -- attempts -------------------------------------------------------------------------
    def next_attempt_number(self, run_id: str) -> int:
        row = self.db.execute("SELECT MAX(attempt) AS m FROM attempts WHERE run_id=?", (run_id,)).fetchone()
        return 0 if row["m"] is None else int(row["m"]) + 1

    @guarded
    def begin_attempt(self, run_id: str, attempt: int, argv: list[str], cwd: str, env: Mapping[str, str],
                      snapshot: Mapping[str, Any] | None, checkpoint: str | None, resume_step: int | None,
                      remedies: list[Any], gate: Mapping[str, Any] | None) -> None:
        self.db.execute(
            "INSERT INTO attempts(run_id, attempt, argv_json, cwd, env_json, snapshot_json, started_at, "
            "checkpoint, resume_step, remedies_json, gate_json) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (run_id, attempt, json.dumps(redact_argv(argv)), cwd, json.dumps(dict(env), sort_keys=True), _json(snapshot),
             self.clock(), checkpoint, resume_step, _json(list(remedies)) or "[]", _json(gate)))

    @guarded
    def set_attempt_process(self, run_id: str, attempt: int, pid: int, pgid: int, ctime: float) -> None:
        self.db.execute("UPDATE attempts SET pid=?, pgid=?, leader_ctime=? WHERE run_id=? AND attempt=?",
                        (pid, pgid, ctime, run_id, attempt))

    @guarded
    def update_attempt(self, run_id: str, attempt: int, **fields: Any) -> None:
        cols = []
        vals: list[Any] = []
        for k, v in fields.items():
            if k.endswith("_json"):
                v = _json(v)
            cols.append(f"{k}=?")
            vals.append(v)
        if cols:
            self.db.execute(f"UPDATE attempts SET {', '.join(cols)} WHERE run_id=? AND attempt=?",
                            (*vals, run_id, attempt))

    @guarded
    def end_attempt(self, run_id: str, attempt: int, *, exit_code: int | None, signal: str | None,
                    cause: str | None, action: str | None, summary: str, counted: bool = True,
                    detection: Mapping[str, Any] | None = None, decision: Mapping[str, Any] | None = None,
                    shutdown: Mapping[str, Any] | None = None, repeat: Mapping[str, Any] | None = None,
                    progressed: bool = False) -> None:
        self.db.execute(
            "UPDATE attempts SET ended_at=?, exit_code=?, signal=?, cause=?, action=?, summary=?, counted=?, "
            "detection_json=COALESCE(?, detection_json), decision_json=?, shutdown_json=?, repeat_json=?, "
            "progressed=? WHERE run_id=? AND attempt=?",
            (self.clock(), exit_code, signal, cause, action, summary, int(counted), _json(detection),
             _json(decision), _json(shutdown), _json(repeat), int(progressed), run_id, attempt))

    def attempts(self, run_id: str) -> list[AttemptRow]:
        rows = self.db.execute("SELECT * FROM attempts WHERE run_id=? ORDER BY attempt", (run_id,)).fetchall()
        return [AttemptRow(r["attempt"], json.loads(r["argv_json"]), r["cwd"], r["started_at"], r["ended_at"],
                           r["pid"], r["pgid"], r["leader_ctime"], r["exit_code"], r["signal"], r["cause"],
                           r["action"], r["checkpoint"], bool(r["counted"]), r["resume_step"],
                           *repeat_of(r)) for r in rows]

    # -- events and metrics ---------------------------------------------------------------
    @guarded
    def event(self, run_id: str, attempt: int | None, event: str, level: str, message: str | None,
              data: Mapping[str, Any] | None = None) -> None:
        self.db.execute("INSERT INTO events(run_id, attempt, at, event, level, message, data_json) "
                        "VALUES (?,?,?,?,?,?,?)",
                        (run_id, attempt, self.clock(), event, level, None if message is None else redact_text(message),
                         _json(data)))

    @guarded
    def metrics_batch(self, run_id: str, attempt: int, rows: list[tuple[float, Any, Any, Any, Any, Any]]) -> None:
        """All ``rows`` in one statement, so one transaction and one commit. Why JSON and not
        ``executemany``: executemany releases and retakes the GIL for every row, and while the
        output thread parses a metric flood each retake waits for a GIL switch (a convoy): 2 000
        rows took 0.4-1 s instead of 3 ms, and every control reply waited behind them. One
        ``json_each`` statement takes the GIL once."""
        self.db.execute(
            "INSERT INTO metrics(run_id, attempt, at, step, loss, grad_norm, tokens_per_sec, val_loss) "
            "SELECT ?, ?, json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'), "
            "json_extract(value, '$[3]'), json_extract(value, '$[4]'), json_extract(value, '$[5]') "
            "FROM json_each(?) ORDER BY CAST(key AS INTEGER)",
            (run_id, attempt, _numbers_json(rows)))

    def failure_record(self) -> tuple[float, int, list[float]]:
        """Across every run in this state dir: seconds the jobs ran, failures (counted attempts
        that ended with a cause other than a manual restart), and each relaunch's launch -> first
        step seconds. What the checkpoint interval advice needs (core/interval.py)."""
        rows = self.db.execute(
            "SELECT attempt, started_at, ended_at, cause, counted, first_step_at FROM attempts").fetchall()
        ran = sum(max(0.0, r["ended_at"] - r["started_at"]) for r in rows if r["ended_at"] is not None)
        failures = sum(1 for r in rows if r["cause"] and r["cause"] != "manual" and r["counted"])
        restarts = [r["first_step_at"] - r["started_at"] for r in rows
                    if r["attempt"] > 0 and r["first_step_at"] is not None and r["first_step_at"] >= r["started_at"]]
        return ran, failures, restarts

    def recent_step_times(self, run_id: str, limit: int = 5000) -> list[float]:
        """Wall times of the newest ``limit`` metric records with a step, oldest first."""
        rows = self.db.execute("SELECT at FROM metrics WHERE run_id=? AND step IS NOT NULL ORDER BY at DESC LIMIT ?",
                               (run_id, limit)).fetchall()
        return sorted(r["at"] for r in rows)

    def metrics(self, run_id: str) -> Iterator[sqlite3.Row]:
        return iter(self.db.execute("SELECT * FROM metrics WHERE run_id=? ORDER BY at", (run_id,)).fetchall())

    # -- history (SPEC shape) -------------------------------------------------------------
    def history(self, run_id: str | None = None) -> dict[str, Any]:
        """The run ``run_id`` (the newest when None) as ``history --json`` gives it (SPEC)."""
        return redact_data(history_of(self.db, run_id or self.latest_run_id()))  # rows an older daemon wrote too
