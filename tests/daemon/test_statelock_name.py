"""One job per state dir across every life (issue 24 build 1): the abstract-socket name lock
survives the state dir being deleted and re-created; through the real daemon."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.daemon.statelock import StateDirLocked, StateLock, take_name
from tests.conftest import ROOT, pid_alive
from tests.daemon.test_hardening import SLEEPER, wrap
from tests.util import wait_for


def test_a_second_run_on_a_recreated_state_dir_is_refused_while_the_first_lives(daemons, tmp_path: Path) -> None:
    sd, ready, ready2 = tmp_path / "sd", tmp_path / "ready", tmp_path / "ready2"
    d1 = daemons(wrap(sd) + SLEEPER + [str(ready)])
    # The file is created, then its pid written: wait for the pid, not for the file.
    wait_for(lambda: ready.exists() and ready.read_text().strip(), 30, what="job ready")
    job = int(ready.read_text())
    shutil.rmtree(sd)
    # At once (the path absent, or already re-taken by the first daemon), then once it is re-taken.
    for _ in range(2):
        d2 = subprocess.run([sys.executable, "-m", "supervisor", *wrap(sd), *SLEEPER, str(ready2)],
                            capture_output=True, text=True, timeout=60, cwd=str(ROOT))
        assert d2.returncode == 2, d2.stderr  # SPEC: 2 = refused, the state dir is in use
        assert f"pid {d1.proc.pid}" in d2.stderr and "already running" in d2.stderr, d2.stderr
        assert "Traceback" not in d2.stderr
        wait_for(lambda: "event=state_dir_retaken" in d1.stderr(), 30, what="state_dir_retaken event")
    assert not ready2.exists(), "no second copy of the job was started"
    assert pid_alive(job) and d1.proc.poll() is None, "the first job is untouched"
    d1.signal(signal.SIGTERM)
    assert d1.wait(30) == 143
    # Once the first daemon is gone the name is free again: the path is usable at once.
    again = StateLock.acquire(sd)
    again.release()


def test_the_name_lock_is_freed_on_release_and_held_across_a_recreated_dir(tmp_path: Path) -> None:
    sd = tmp_path / "sd"
    first = StateLock.acquire(sd)
    shutil.rmtree(sd)
    sd.mkdir()
    with pytest.raises(StateDirLocked, match="already running"):
        StateLock.acquire(sd)
    first.release()
    StateLock.acquire(sd).release()


@pytest.mark.skipif(os.geteuid() != 0, reason="chroot needs root (CAP_SYS_CHROOT)")
def test_the_same_path_in_another_root_is_another_name(tmp_path: Path) -> None:
    """Two containers on the host's network namespace share abstract names; the same state dir
    path inside each is two different dirs, so neither may refuse the other."""
    sd = tmp_path / "sd"
    held = StateLock.acquire(sd)
    try:
        root = tmp_path / "root"
        root.mkdir()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: another root, the same path, bound while the parent holds it
            os.close(r)
            try:
                os.chroot(root)
                s = take_name(sd)
                os.write(w, b"bound" if s is not None else b"none")
            except BaseException as e:  # reported to the parent, never raised in a forked pytest
                os.write(w, repr(e).encode()[:500])
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            said = f.read().decode()
        os.waitpid(pid, 0)
        assert said == "bound", said
        with pytest.raises(StateDirLocked, match="already running"):
            take_name(sd)  # in our own root the name is still held
    finally:
        held.release()
