"""The state dir deleted or made unusable under a live daemon, and a read-only state dir at start
(issue 24): through the real daemon and the real CLI."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import pytest

from supervisor.daemon.plugin import Tick
from supervisor.daemon.statelock import StateLock, StateLockPlugin
from supervisor.ledger.store import Ledger
from tests.conftest import ROOT, history, pid_alive
from tests.daemon.test_hardening import SLEEPER, wrap
from tests.util import wait_for

PY = sys.executable


def _cli(*args: str, timeout: float = 120) -> "subprocess.CompletedProcess[str]":
    return subprocess.run([PY, "-m", "supervisor", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=str(ROOT))


@pytest.fixture
def mounts() -> Iterator[list[Path]]:
    """Read-only tmpfs mounts made by the test, unmounted at teardown (needs root and
    CAP_SYS_ADMIN: the test is skipped, saying so, where mount is refused)."""
    made: list[Path] = []
    yield made
    for where in reversed(made):
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _mount_ro(mounts: list[Path], where: Path, mode: str = "ro") -> None:
    where.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", f"{mode},size=2m,mode=0700", "tmpfs", str(where)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here (needs root and CAP_SYS_ADMIN): {out.stderr.strip()}")
    mounts.append(where)


def test_a_deleted_state_dir_is_retaken_status_and_stop_work_and_no_second_job_starts(daemons, tmp_path):
    sd, ready, ready2 = tmp_path / "sd", tmp_path / "ready", tmp_path / "ready2"
    d1 = daemons(wrap(sd) + SLEEPER + [str(ready)])
    wait_for(ready.exists, 30, what="job ready")
    job = int(ready.read_text())
    shutil.rmtree(sd)
    wait_for(lambda: "event=state_dir_retaken" in d1.stderr(), 30, what="state_dir_retaken event")
    assert "state_dir_lost" in d1.stderr() and "Traceback" not in d1.stderr(), d1.stderr()[-4000:]
    assert stat.S_IMODE(os.stat(sd).st_mode) == 0o700
    def status_says_retaken() -> bool:  # status answers from a cache the loop refreshes every second or so
        st = _cli("status", "--json", "--state-dir", str(sd))
        assert st.returncode == 0, st.stderr  # the control socket answers again
        return '"state_dir_retaken": 1' in st.stdout

    wait_for(status_says_retaken, 30, interval=0.5, what="status showing the re-take")
    h = history(sd)  # the ledger was moved, not started empty: the daemon's start is still in it
    names = [e["event"] for e in h["events"]]
    assert "daemon_started" in names and "state_dir_lost" in names and "state_dir_retaken" in names, (names, d1.stderr()[-4000:])
    assert len(h["attempts"]) == 1, h["attempts"]
    again = _cli(*wrap(sd), *SLEEPER, str(ready2), timeout=60)
    assert again.returncode == 2 and "already running" in again.stderr, again.stderr
    assert not ready2.exists(), "no second copy of the job was started"
    assert pid_alive(job), d1.stderr()[-4000:]
    stop = _cli("stop", "--state-dir", str(sd))
    assert stop.returncode == 0, (stop.stderr, d1.stderr()[-4000:])
    assert d1.wait(60) == 0, d1.stderr()[-4000:]
    wait_for(lambda: not pid_alive(job), 30, what="the job stopped")


def test_a_state_dir_that_cannot_be_retaken_stops_the_job_with_a_clear_reason(daemons, tmp_path, mounts):
    sd, ready = tmp_path / "sd", tmp_path / "ready"
    d1 = daemons(wrap(sd) + SLEEPER + [str(ready)])
    wait_for(ready.exists, 30, what="job ready")
    job = int(ready.read_text())
    _mount_ro(mounts, sd)  # the path now names an empty read-only folder: nothing can be made there
    assert d1.wait(60) == 143, d1.stderr()[-3000:]
    err = d1.stderr()
    assert "event=state_dir_unusable" in err and "Read-only file system" in err and "Traceback" not in err, err[-3000:]
    wait_for(lambda: not pid_alive(job), 30, what="the job stopped")


def test_a_read_only_state_dir_at_start_is_a_clear_error_and_starts_nothing(tmp_path, mounts):
    ready = tmp_path / "ready"
    for sd in (tmp_path / "ro", tmp_path / "ro" / "sub"):  # the dir itself read-only; its parent
        if not mounts:
            _mount_ro(mounts, sd)
        cp = _cli(*wrap(sd), *SLEEPER, str(ready), timeout=60)
        assert cp.returncode == 2, cp.stderr
        assert "Read-only file system" in cp.stderr and "nothing was started" in cp.stderr, cp.stderr
        assert "Traceback" not in cp.stderr and not ready.exists()


def test_a_state_dir_remounted_read_only_keeps_its_history_readable_and_refuses_a_daemon_clearly(tmp_path, mounts):
    mnt = tmp_path / "mnt"
    _mount_ro(mounts, mnt, mode="rw")
    sd = mnt / "sd"
    assert _cli(*wrap(sd), PY, "-c", "pass", timeout=60).returncode == 0
    remount = subprocess.run(["mount", "-o", "remount,ro", str(mnt)], capture_output=True, text=True)
    assert remount.returncode == 0, remount.stderr
    h = _cli("history", "--json", "--state-dir", str(sd))
    assert h.returncode == 0 and '"state": "finished"' in h.stdout, h.stderr  # not "corrupt, move it aside"
    cp = _cli(*wrap(sd), PY, "-c", "pass", timeout=60)
    assert cp.returncode == 2 and "Read-only file system" in cp.stderr and "Traceback" not in cp.stderr, cp.stderr


def test_the_ledger_is_moved_with_its_rows_into_a_recreated_dir(tmp_path: Path) -> None:
    sd = tmp_path / "sd"
    led = Ledger(sd)
    run_id, _ = led.open_run("job", {})
    led.event(run_id, None, "before", "info", "kept")
    shutil.rmtree(sd)
    led.event(run_id, None, "meanwhile", "info", "written into the deleted file, kept too")
    sd.mkdir()
    said = led.retake(run_id, "job", {})
    assert "nothing lost" in said
    led.event(run_id, None, "after", "info", "in the new file")
    led.close()
    got = [e["event"] for e in Ledger(sd, readonly=True).history(run_id)["events"]]
    assert got == ["before", "meanwhile", "after"]
    assert stat.S_IMODE(os.stat(sd / "ledger.sqlite").st_mode) == 0o600


def test_a_ledger_that_cannot_be_copied_is_started_fresh_for_the_same_run_and_says_so(tmp_path, monkeypatch):
    import sqlite3

    from supervisor.ledger.connection import LockedConnection

    sd = tmp_path / "sd"
    led = Ledger(sd)
    run_id, _ = led.open_run("job", {})
    led.event(run_id, None, "before", "info", "lost with the old dir")
    shutil.rmtree(sd)
    sd.mkdir()
    real = LockedConnection.move_to

    def copy_fails(self: LockedConnection, new: sqlite3.Connection, *, copy: bool) -> None:
        if copy:  # the boundary we cannot make fail for real: SQLite's backup of a deleted file
            new.close()
            raise sqlite3.DatabaseError("disk I/O error")
        real(self, new, copy=copy)

    monkeypatch.setattr(LockedConnection, "move_to", copy_fails)
    said = led.retake(run_id, "job", {"job": {"name": "job"}})
    assert "fresh ledger continues run" in said and "lost" in said and "disk I/O error" in said
    led.event(run_id, None, "after", "info", "kept")
    led.close()
    h = Ledger(sd, readonly=True).history(run_id)
    assert h["state"] == "running" and [e["event"] for e in h["events"]] == ["after"]


def _view(tmp: Path) -> Any:
    """The run as the plug-in reads it: no job (no heartbeat folder to re-make)."""
    return SimpleNamespace(has_job=False, run_id="run-1", attempt=-1)


def _said(effects: Any) -> list[tuple[str, str]]:
    return [(e.event, e.message) for e in effects]


def test_the_retake_waits_while_the_folder_itself_is_still_there(tmp_path: Path) -> None:
    sd = tmp_path / "sd"
    lock = StateLock.acquire(sd)
    c = StateLockPlugin(lock)
    try:
        (sd / "daemon.lock").unlink()  # only a file went (an rm -rf may still be under way)
        said = _said(c.tick(Tick(100.0), _view(tmp_path)))
        assert [e for e, _ in said] == ["state_dir_lost"] and not (sd / "daemon.lock").exists()
        said = _said(c.tick(Tick(100.0 + c.SETTLE_S), _view(tmp_path)))
        assert [e for e, _ in said] == ["state_dir_retaken"] and (sd / "daemon.lock").exists()
        assert c.status(_view(tmp_path))["state_dir_lost"] is None and c.status(_view(tmp_path))["state_dir_retaken"] == 1
    finally:
        lock.release()


def test_a_failed_retake_is_tried_again_then_stops_the_job_once(tmp_path: Path) -> None:
    sd = tmp_path / "sd"
    lock = StateLock.acquire(sd)
    stops: list[int] = []
    c = StateLockPlugin(lock, stop=lambda: stops.append(1))
    try:
        shutil.rmtree(sd)
        sd.write_text("a file where the state dir was")  # nothing can be made at the name
        said = _said(c.tick(Tick(100.0), _view(tmp_path)))
        assert [e for e, _ in said] == ["state_dir_lost"] and stops == []  # tried, tried again next second
        said += _said(c.tick(Tick(100.0 + c.GIVE_UP_AFTER_S), _view(tmp_path)))
        assert [e for e, _ in said] == ["state_dir_lost", "state_dir_unusable"] and stops == [1]
        assert "File exists" in said[-1][1] and "exit 143" in said[-1][1]
        assert c.tick(Tick(200.0), _view(tmp_path)) == () and stops == [1]  # said and done once
        assert sd.read_text() == "a file where the state dir was"  # nothing replaced
    finally:
        lock.release()
