"""The supervisor's own folders beside the job's files (last_good/, quarantine/, heartbeats/)
are never followed through a symlink someone planted: refused with a clear error, nothing written
or moved outside the checkpoint dir, nothing deleted (issue 24 build 4)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from supervisor.checkpoints.discovery import Discovery
from supervisor.checkpoints.quarantine import preserve_last_good, quarantine
from supervisor.ownpaths import NotOurFolder, own_dir


def _ckpt(folder: Path, data: bytes = b"a" * 4096) -> Path:
    folder.mkdir(exist_ok=True)
    p = folder / "ckpt.pt"
    p.write_bytes(data)
    return p


@pytest.mark.parametrize("link", [False, True])
def test_a_symlinked_last_good_is_refused_and_nothing_is_written_where_it_points(tmp_path, link):
    ck, elsewhere = tmp_path / "ck", tmp_path / "elsewhere"
    p = _ckpt(ck)
    elsewhere.mkdir()
    (ck / "last_good").symlink_to(elsewhere)
    with pytest.raises(NotOurFolder) as ei:
        preserve_last_good(p, link=link)
    assert str(ck / "last_good") in str(ei.value) and "symlink" in str(ei.value)
    assert list(elsewhere.iterdir()) == []  # no copy, no temp file outside the checkpoint dir
    assert (ck / "last_good").is_symlink() and p.read_bytes() == b"a" * 4096  # nothing deleted


def test_last_good_that_is_a_file_is_refused_not_replaced(tmp_path):
    ck = tmp_path / "ck"
    p = _ckpt(ck)
    (ck / "last_good").write_text("someone's notes")
    with pytest.raises(NotOurFolder, match="not a folder"):
        preserve_last_good(p)
    assert (ck / "last_good").read_text() == "someone's notes"


def test_a_symlinked_quarantine_is_refused_and_the_checkpoint_stays(tmp_path):
    ck, elsewhere = tmp_path / "ck", tmp_path / "elsewhere"
    p = _ckpt(ck)
    elsewhere.mkdir()
    (ck / "quarantine").symlink_to(elsewhere)
    with pytest.raises(NotOurFolder):
        quarantine(p, "nan in weights")
    assert p.exists() and list(elsewhere.iterdir()) == []


def test_files_under_a_symlinked_last_good_are_not_restart_candidates(tmp_path):
    ck, elsewhere = tmp_path / "ck", tmp_path / "elsewhere"
    ck.mkdir()
    elsewhere.mkdir()
    (elsewhere / "ckpt.pt").write_bytes(b"planted")
    (ck / "last_good").symlink_to(elsewhere)
    real = tmp_path / "ck2"
    real.mkdir()
    (real / "last_good").mkdir()
    (real / "last_good" / "ckpt.pt").write_bytes(b"kept")
    # settle_s=0: the scan sees both at once; the real last_good/ shows the scan would list one.
    assert [c.path.name for c in Discovery(real, settle_s=0, follow_symlinks_out=True).scan()] == ["ckpt.pt"]
    assert Discovery(ck, settle_s=0, follow_symlinks_out=True).scan() == []


def test_own_dir_creates_and_accepts_a_real_folder_and_refuses_a_symlinked_heartbeats(tmp_path):
    hb = own_dir(tmp_path / "state" / "heartbeats", parents=True)
    assert hb.is_dir() and own_dir(hb) == hb  # idempotent
    other = tmp_path / "other"
    other.mkdir()
    (tmp_path / "state2").mkdir()
    (tmp_path / "state2" / "heartbeats").symlink_to(other)
    with pytest.raises(NotOurFolder, match="heartbeats"):
        own_dir(tmp_path / "state2" / "heartbeats")
    assert list(other.iterdir()) == [] and os.path.islink(tmp_path / "state2" / "heartbeats")
