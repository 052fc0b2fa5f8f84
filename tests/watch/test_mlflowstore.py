"""MLflow's local stores read without MLflow: the SQLite store a real MLflow run writes, the
file store's lines, and what a hostile or half-made store does to the reader (bounded, said)."""

from __future__ import annotations

import math
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from supervisor.watch.mlflowstore import (DB_ROWS_PER_READ, MlflowDb, StoreUnreadable, file_store_key,
                                          file_store_records, is_file_store_metric)

_JOB = """
import mlflow
with mlflow.start_run():
    for s in range(4):
        mlflow.log_metric("train/loss", [2.0, 1.5, float("nan"), 1.0][s], step=s)
        mlflow.log_metric("grad_norm", [1.0, float("inf"), 1.0, float("-inf")][s], step=s)
        mlflow.log_metric("lr", 0.1, step=s)
"""


def _mlflow_run(cwd: Path) -> Path:
    """A real MLflow run in a child, at MLflow's defaults (MLflow 3: sqlite:///mlflow.db in the cwd)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    subprocess.run([sys.executable, "-c", _JOB], cwd=cwd, env=env, check=True, capture_output=True, timeout=170)
    db = cwd / "mlflow.db"
    assert db.is_file(), "MLflow's default store is no longer ./mlflow.db: the discovery must follow it"
    return db


def test_a_real_mlflow_store_reads_back_nan_and_inf_with_their_steps(tmp_path: Path) -> None:
    db = MlflowDb(str(_mlflow_run(tmp_path)))
    recs, more = db.read("mlflow:" + db.path)
    assert not more
    losses = [(r.step, r.loss) for r in recs if r.loss is not None]
    grads = [(r.step, r.grad_norm) for r in recs if r.grad_norm is not None]
    assert [s for s, _ in losses] == [0, 1, 2, 3]
    assert losses[0][1] == 2.0 and math.isnan(losses[2][1])  # stored as value 0, is_nan 1
    assert grads[1][1] == math.inf and grads[3][1] == -math.inf  # stored as +-float max
    assert all(r.fmt == "mlflow" for r in recs) and not any(r.lr for r in recs)  # lr alone: no record
    assert all(r.at <= time.time() for r in recs)
    # Nothing new: nothing read again.
    assert db.read("s") == ([], False)


@pytest.mark.slow
def test_history_is_skipped_and_later_rows_are_read(tmp_path: Path) -> None:
    db = MlflowDb(str(_mlflow_run(tmp_path)))
    db.skip_history()
    assert db.read("s") == ([], False)
    conn = sqlite3.connect(db.path)
    run = conn.execute("SELECT run_uuid FROM runs").fetchone()[0]
    conn.execute("INSERT INTO metrics VALUES ('loss', 0, 1, ?, 7, 1)", (run,))
    conn.commit()
    conn.close()
    recs, _ = db.read("s")
    assert len(recs) == 1 and recs[0].step == 7 and math.isnan(recs[0].loss or 0.0)


def _schema(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path)
    conn.execute('CREATE TABLE metrics ("key" VARCHAR(250) NOT NULL, value FLOAT NOT NULL, timestamp BIGINT NOT NULL, '
                 "run_uuid VARCHAR(32) NOT NULL, step BIGINT DEFAULT '0' NOT NULL, is_nan BOOLEAN DEFAULT '0' NOT NULL)")
    return conn


def test_a_backlog_is_read_in_bounded_pieces_and_a_huge_key_is_cut(tmp_path: Path) -> None:
    conn = _schema(tmp_path / "mlflow.db")
    n = DB_ROWS_PER_READ * 20  # 100x past one read's bound would take minutes to write; 20x shows the cut
    conn.executemany("INSERT INTO metrics VALUES (?, ?, 0, 'r', ?, 0)", (("loss", 1.0, i) for i in range(n)))
    conn.execute("INSERT INTO metrics VALUES (?, 1.0, 0, 'r', ?, 0)", ("k" * 5_000_000, n))
    conn.commit()
    conn.close()
    db = MlflowDb(str(tmp_path / "mlflow.db"))
    reads, total = 0, 0
    more = True
    while more:
        recs, more = db.read("s")
        reads += 1
        total += len(recs)
        assert len(recs) <= DB_ROWS_PER_READ
    assert total == n and reads >= 20  # the 5 MB key is no loss key: cut in SQL, no record


def test_a_store_that_is_not_ready_or_not_a_database_is_said_not_raised_elsewhere(tmp_path: Path) -> None:
    junk = tmp_path / "junk" / "mlflow.db"
    junk.parent.mkdir()
    junk.write_bytes(b"\0" * 4096 + b"not sqlite")
    with pytest.raises(StoreUnreadable, match="not an SQLite database|cannot open"):
        MlflowDb(str(junk)).read("s")
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    with pytest.raises(StoreUnreadable, match="no metrics table yet"):
        MlflowDb(str(empty)).read("s")
    with pytest.raises(StoreUnreadable):
        MlflowDb(str(tmp_path / "missing.db")).read("s")
    assert not (tmp_path / "missing.db").exists()  # read-only: the reader creates nothing


def test_a_locked_store_does_not_hold_the_reader(tmp_path: Path) -> None:
    conn = _schema(tmp_path / "mlflow.db")
    conn.commit()
    conn.isolation_level = None
    conn.execute("BEGIN EXCLUSIVE")  # a writer that holds the lock (MLflow's, or a hostile one)
    try:
        t0 = time.monotonic()
        with pytest.raises(StoreUnreadable):
            MlflowDb(str(tmp_path / "mlflow.db")).read("s")
        assert time.monotonic() - t0 < 5.0  # busy timeout 50 ms; 5 s holds on a loaded machine
    finally:
        conn.execute("ROLLBACK")
        conn.close()


def test_file_store_lines_and_paths() -> None:
    path = os.path.join("w", "mlruns", "0", "abc", "metrics", "train", "loss")
    assert is_file_store_metric(path) and file_store_key(path) == "train/loss"
    assert not is_file_store_metric(os.path.join("w", "mlruns", "0", "abc", "params", "lr"))
    assert not is_file_store_metric(os.path.join("w", "out", "metrics", "loss"))
    lines = [b"1796655624679 1.0 0\n", b"1796655624686 nan 2\n", b"garbage\n", b"1 " + b"9" * 5000 + b" 3\n"]
    recs = file_store_records("train/loss", lines, "mlflow:x")
    assert [r.step for r in recs] == [0, 2] and math.isnan(recs[1].loss or 0.0)
    assert file_store_records("lr", [b"1 0.1 0\n"], "s") == []


def test_a_view_in_place_of_the_table_is_refused_before_any_row_is_read(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "mlflow.db")
    # The adversarial store: one SELECT of it materialises and sorts 30,000 blobs of 5 MB (47 s and
    # 1.6 GB of temp file when it was read as if it were MLflow's table).
    conn.execute("CREATE VIEW metrics AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c LIMIT 30000) "
                 "SELECT x AS rowid, 'loss' AS key, zeroblob(5000000) AS value, 0 AS timestamp, x AS step, "
                 "0 AS is_nan FROM c")
    conn.commit()
    conn.close()
    db = MlflowDb(str(tmp_path / "mlflow.db"))
    t0 = time.monotonic()
    with pytest.raises(StoreUnreadable, match="is a view"):
        db.read("s")
    with pytest.raises(StoreUnreadable, match="is a view"):
        db.skip_history()
    assert time.monotonic() - t0 < 5.0


def test_blobs_in_the_number_columns_stay_in_sqlite(tmp_path: Path) -> None:
    conn = _schema(tmp_path / "mlflow.db")
    conn.executemany("INSERT INTO metrics VALUES ('loss', zeroblob(200000), zeroblob(10), 'r', zeroblob(10), 0)",
                     [()] * 50)  # 10 MB of blobs where numbers belong (far more is cut by the read's time bound)
    conn.execute("INSERT INTO metrics VALUES ('loss', 0, 1, 'r', 51, 1)")
    conn.commit()
    conn.close()
    recs, more = MlflowDb(str(tmp_path / "mlflow.db")).read("s")
    assert not more and [r.step for r in recs] == [51] and math.isnan(recs[0].loss or 0.0)
