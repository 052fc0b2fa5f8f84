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


def _swapped_after_check(monkeypatch: pytest.MonkeyPatch, module: object, elsewhere: Path) -> list[Path]:
    """Make ``module``'s own_dir_fd swap the folder for a link to ``elsewhere`` right after its
    check (the race a by-name write would lose); the real folders it moved aside."""
    from supervisor import ownpaths

    moved: list[Path] = []

    def checked_then_swapped(path: Path, parents: bool = False) -> int:
        fd = ownpaths.own_dir_fd(path, parents)
        aside = Path(path).with_name(Path(path).name + ".real")
        os.rename(path, aside)
        Path(path).symlink_to(elsewhere)
        moved.append(aside)
        return fd

    monkeypatch.setattr(module, "own_dir_fd", checked_then_swapped)
    return moved


@pytest.mark.parametrize("link", [False, True])
def test_a_last_good_swapped_for_a_link_after_its_check_still_gets_the_copy(tmp_path, monkeypatch, link):
    from supervisor.checkpoints import quarantine as q

    ck, elsewhere = tmp_path / "ck", tmp_path / "elsewhere"
    p = _ckpt(ck)
    elsewhere.mkdir()
    moved = _swapped_after_check(monkeypatch, q, elsewhere)
    kept = preserve_last_good(p, link=link)
    assert kept == ck / "last_good" / "ckpt.pt"  # the name it has; the bytes went where it was checked
    assert list(elsewhere.iterdir()) == [] and (moved[0] / "ckpt.pt").read_bytes() == p.read_bytes()
    assert [f.name for f in moved[0].iterdir()] == ["ckpt.pt"]  # no temp file left


def test_a_snapshot_and_a_quarantine_go_into_the_folder_checked_not_where_a_swapped_link_points(tmp_path, monkeypatch):
    from supervisor.checkpoints import quarantine as q, snapshot as s

    ck, elsewhere = tmp_path / "ck", tmp_path / "elsewhere"
    p = _ckpt(ck)
    elsewhere.mkdir()
    moved = _swapped_after_check(monkeypatch, s, elsewhere)
    snap = s.take_snapshot(p, link=False, headroom=s.Headroom(0.0, 0.0))
    assert list(elsewhere.iterdir()) == [] and (moved[0] / snap.path.name).read_bytes() == p.read_bytes()
    monkeypatch.undo()
    with pytest.raises(NotOurFolder):  # promoting by the name, now a link, is refused
        s.promote(snap)
    assert list(elsewhere.iterdir()) == []
    (ck / "last_good").unlink()
    moved = _swapped_after_check(monkeypatch, q, elsewhere)
    rec = q.quarantine(p, "nan in weights")
    assert rec.dest == ck / "quarantine" / "ckpt.pt" and not p.exists()
    assert sorted(f.name for f in moved[0].iterdir()) == ["ckpt.pt", "ckpt.pt" + q.NOTE_SUFFIX]
    assert list(elsewhere.iterdir()) == []


def test_files_made_through_a_checked_folder_land_in_it_after_the_name_is_swapped(tmp_path):
    from supervisor.ownpaths import open_in, own_dir_fd, own_subdir_fd

    hb, elsewhere = tmp_path / "heartbeats", tmp_path / "elsewhere"
    elsewhere.mkdir()
    fd = own_dir_fd(hb)
    try:
        hb.rename(tmp_path / "hb.real")
        hb.symlink_to(elsewhere)
        os.close(open_in(fd, "f", os.O_WRONLY | os.O_CREAT))
        os.close(own_subdir_fd(fd, "attempt-0", hb / "attempt-0"))
        with pytest.raises(OSError):  # never through a link at the file's own name
            os.symlink(elsewhere / "x", tmp_path / "hb.real" / "l")
            open_in(fd, "l", os.O_WRONLY | os.O_CREAT)
        with pytest.raises(ValueError):
            open_in(fd, "../escape", os.O_WRONLY | os.O_CREAT)
    finally:
        os.close(fd)
    assert sorted(p.name for p in (tmp_path / "hb.real").iterdir()) == ["attempt-0", "f", "l"]
    assert list(elsewhere.iterdir()) == []
    with pytest.raises(NotOurFolder):
        own_dir_fd(hb)  # the name, now a link, is refused
