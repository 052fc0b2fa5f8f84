"""Snapshot first (snapshot.py) on real files: a hard link keeps a version the job replaces by
rename, a copy is made only within the free-space headroom, a copy that fails leaves nothing
behind, and an in-place rewrite during the copy is no version."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from supervisor.checkpoints.hashing import StatKey
from supervisor.checkpoints.snapshot import (ChangedWhileCopied, Headroom, NotKeptError, copy_room_problem, promote,
                                             take_snapshot)


def save(path: Path, data: bytes) -> None:
    """The job's save by rename (a new inode per save)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def test_a_hard_link_keeps_the_version_the_job_replaces_by_rename(tmp_path: Path) -> None:
    p = tmp_path / "ckpt.pt"
    save(p, b"version 1" * 1000)
    snap = take_snapshot(p, link=True, headroom=Headroom())
    assert snap.how == "hard link" and snap.version == StatKey.of(p)
    save(p, b"version 2" * 1000)  # during the load test
    assert snap.path.read_bytes() == b"version 1" * 1000
    kept = promote(snap)
    assert kept == tmp_path / "last_good" / "ckpt.pt" and kept.read_bytes() == b"version 1" * 1000
    assert p.read_bytes() == b"version 2" * 1000


def test_a_copy_holds_the_version_and_its_mtime(tmp_path: Path) -> None:
    p = tmp_path / "ckpt.pt"
    p.write_bytes(b"x" * 4096)
    snap = take_snapshot(p, link=False, headroom=Headroom(0, 0))
    assert snap.how in ("copy", "reflink") and snap.path.name.endswith("ckpt.pt") and snap.path.name.startswith(".")
    assert snap.path.stat().st_mtime_ns == p.stat().st_mtime_ns and snap.version == StatKey.of(p)
    p.write_bytes(b"y" * 4096)  # rewritten in place afterwards: the snapshot is untouched
    assert snap.path.read_bytes() == b"x" * 4096


def test_no_copy_that_would_eat_the_room_the_job_needs(tmp_path: Path) -> None:
    p = tmp_path / "ckpt.pt"
    p.write_bytes(b"x" * 4096)
    st = os.statvfs(tmp_path)
    free = st.f_bavail * st.f_frsize
    # A headroom factor that asks for twice what the filesystem has free (other tests free
    # space meanwhile): the rule refuses.
    greedy = Headroom(factor=2 * free / 4096 + 1, fraction=0.0)
    problem = copy_room_problem(tmp_path, 4096, greedy)
    assert problem is not None and "no room for a copy" in problem and "last_good_headroom_factor" in problem
    assert copy_room_problem(tmp_path, 4096, Headroom(0, 0)) is None
    with pytest.raises(NotKeptError, match="no room for a copy"):
        take_snapshot(p, link=False, headroom=greedy)
    assert [x.name for x in (tmp_path / "last_good").iterdir()] == []  # nothing left behind


def test_a_copy_that_fails_leaves_no_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tiny tmpfs (root) and the headroom rule switched off (it would refuse): the copy runs
    out of space half way, a real ENOSPC."""
    monkeypatch.setattr("supervisor.checkpoints.snapshot.copy_room_problem", lambda *_a: None)
    mnt = tmp_path / "small"
    mnt.mkdir()
    cp = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True)
    if cp.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({cp.stderr.decode().strip()}): needs root")
    try:
        p = mnt / "ckpt.pt"
        p.write_bytes(b"x" * 40 * 1024)  # fits once, not twice
        with pytest.raises(NotKeptError, match="the copy failed"):
            take_snapshot(p, link=False, headroom=Headroom(0, 0))
        assert [x.name for x in (mnt / "last_good").iterdir()] == []
        assert p.read_bytes() == b"x" * 40 * 1024  # the job's file untouched
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_an_in_place_rewrite_during_the_copy_is_no_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "ckpt.pt"
    p.write_bytes(b"x" * 4096)
    from supervisor.checkpoints.reflink import copy_contents

    def copy_while_the_job_writes(src_fd: int, dst_fd: int) -> int:
        n = copy_contents(src_fd, dst_fd)
        with open(p, "ab") as f:  # the job appends to the same inode meanwhile
            f.write(b"more")
        return n

    monkeypatch.setattr("supervisor.checkpoints.snapshot.copy_contents", copy_while_the_job_writes)
    with pytest.raises(ChangedWhileCopied):
        take_snapshot(p, link=False, headroom=Headroom(0, 0))
    assert [x.name for x in (tmp_path / "last_good").iterdir()] == []
