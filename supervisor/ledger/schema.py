"""The ledger's tables, as SQL, and how a ledger file of an older schema version is brought up
to this one."""

from __future__ import annotations

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id      TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    created_at  REAL NOT NULL,
    ended_at    REAL,
    state       TEXT NOT NULL,
    exit_code   INTEGER,
    reason      TEXT,
    config_json TEXT
);
CREATE TABLE IF NOT EXISTS attempts (
    run_id          TEXT NOT NULL REFERENCES runs(run_id),
    attempt         INTEGER NOT NULL,
    argv_json       TEXT NOT NULL,
    cwd             TEXT NOT NULL,
    env_json        TEXT NOT NULL,
    snapshot_json   TEXT,
    started_at      REAL NOT NULL,
    ended_at        REAL,
    pid             INTEGER,
    pgid            INTEGER,
    leader_ctime    REAL,
    exit_code       INTEGER,
    signal          TEXT,
    cause           TEXT,
    action          TEXT,
    checkpoint      TEXT,
    resume_step     INTEGER,
    remedies_json   TEXT NOT NULL DEFAULT '[]',
    validation_json TEXT,
    detection_json  TEXT,
    gate_json       TEXT,
    decision_json   TEXT,
    shutdown_json   TEXT,
    summary         TEXT,
    counted         INTEGER NOT NULL DEFAULT 1,
    first_step_at   REAL,
    last_step       INTEGER,
    PRIMARY KEY (run_id, attempt)
);
CREATE TABLE IF NOT EXISTS events (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id    TEXT NOT NULL,
    attempt   INTEGER,
    at        REAL NOT NULL,
    event     TEXT NOT NULL,
    level     TEXT NOT NULL,
    message   TEXT,
    data_json TEXT
);
CREATE INDEX IF NOT EXISTS events_run ON events(run_id, id);
CREATE TABLE IF NOT EXISTS metrics (
    run_id   TEXT NOT NULL,
    attempt  INTEGER NOT NULL,
    at       REAL NOT NULL,
    step     INTEGER,
    loss     REAL,
    grad_norm REAL,
    tokens_per_sec REAL,
    val_loss REAL
);
CREATE INDEX IF NOT EXISTS metrics_run ON metrics(run_id, attempt, step);
"""

LEDGER_FILE = "ledger.sqlite"

# The ledger's schema version, kept in SQLite's user_version. A file of an older version is
# migrated on open (MIGRATIONS[n] takes version n to n + 1); one of a newer version is refused
# (an older supervisor must not write into a ledger it does not understand).
SCHEMA_VERSION = 2
MIGRATIONS: dict[int, str] = {
    0: "",  # version 0: files written before the version was kept; SCHEMA (IF NOT EXISTS) is enough
    # Version 2: what each failure looked like (policy.RepeatKey as JSON) and whether the attempt
    # made progress, so a restarted daemon keeps "no third identical attempt" and the backoff
    # streak. Added here, not in SCHEMA: a new file runs every migration too.
    1: "ALTER TABLE attempts ADD COLUMN repeat_json TEXT;\n"
       "ALTER TABLE attempts ADD COLUMN progressed INTEGER NOT NULL DEFAULT 0;",
}
