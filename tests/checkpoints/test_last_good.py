"""The last good copy of a single overwritten checkpoint: hard link, reflink or copy, the size
cap, and the disk it costs (issue 11). Through the real daemon: tests/e2e/test_recovery_e2e.py."""
from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from supervisor.checkpoints.quarantine import last_good_disk_bytes, preserve_last_good
from supervisor.checkpoints import reflink
from supervisor.checkpoints.reflink import clone_file, copy_contents


def _ckpt(folder: Path, data: bytes) -> Path:
    folder.mkdir(exist_ok=True)
    p = folder / "ckpt.pt"
    tmp = folder / "ckpt.pt.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, p)
    return p


def _reflinks(folder: Path) -> bool:
    (folder / "probe").write_bytes(b"x" * 4096)
    return clone_file(folder / "probe", folder / "probe.clone")


def test_without_reflinks_the_clone_says_no_and_leaves_nothing_behind(tmp_path):
    if _reflinks(tmp_path):
        pytest.skip("this filesystem clones; the fallback is not reachable here")
    assert not (tmp_path / "probe.clone").exists()
    with pytest.raises(FileNotFoundError):
        clone_file(tmp_path / "absent", tmp_path / "x")  # a real error is raised, not taken for "unsupported"


def _copy(src: Path, dst: Path) -> int:
    with open(src, "rb") as s, open(dst, "wb") as d:
        return copy_contents(s.fileno(), d.fileno())


@pytest.mark.parametrize("refused", [(), ("copy_file_range",), ("copy_file_range", "sendfile")],
                         ids=["kernel", "sendfile", "buffer"])
def test_the_copy_is_every_byte_whatever_the_kernel_refuses(tmp_path, monkeypatch, refused):
    # Where copy_file_range is refused (across filesystems before Linux 5.3) sendfile copies, and
    # where that is refused too, one reused buffer; from wherever the refusal came, never twice.
    calls = {"copy_file_range": 0, "sendfile": 0}
    for name in ("copy_file_range", "sendfile"):
        real = getattr(os, name)

        def fake(*a, _real=real, _name=name):
            calls[_name] += 1
            if _name in refused:
                raise OSError(errno.EXDEV, "refused here")
            return _real(*a)

        monkeypatch.setattr(reflink.os, name, fake)
    data = os.urandom(3 * 1024 * 1024 + 7)  # more than the fallback's buffer, not a multiple of it
    src = tmp_path / "src.pt"
    src.write_bytes(data)
    assert _copy(src, tmp_path / "dst.pt") == len(data)
    assert (tmp_path / "dst.pt").read_bytes() == data
    assert calls["copy_file_range"] >= 1
    assert (calls["sendfile"] >= 1) == ("copy_file_range" in refused)
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    assert _copy(empty, tmp_path / "empty.copy") == 0 and (tmp_path / "empty.copy").read_bytes() == b""


def test_a_copy_that_cannot_be_written_is_an_error_not_a_short_file(tmp_path):
    src = tmp_path / "src.pt"
    src.write_bytes(b"x" * 10_000)
    (tmp_path / "ro").write_bytes(b"")
    with open(src, "rb") as s:
        fd = os.open(tmp_path / "ro", os.O_RDONLY)  # not writable: every way of copying is refused
        try:
            with pytest.raises(OSError) as e:
                copy_contents(s.fileno(), fd)
            assert e.value.errno == errno.EBADF
        finally:
            os.close(fd)


def test_a_copy_is_kept_where_nothing_cheaper_works_and_costs_its_size(tmp_path):
    ck = tmp_path / "ck"
    p = _ckpt(ck, b"a" * 100_000)
    assert last_good_disk_bytes(ck) is None  # no last_good/ yet
    kept = preserve_last_good(p)
    assert kept is not None and kept.read_bytes() == p.read_bytes()
    assert kept.stat().st_ino != p.stat().st_ino
    assert last_good_disk_bytes(ck) == kept.stat().st_blocks * 512 >= 100_000


def test_a_hard_link_costs_nothing_until_the_job_replaces_the_file(tmp_path):
    ck = tmp_path / "ck"
    p = _ckpt(ck, b"a" * 100_000)
    kept = preserve_last_good(p, link=True)
    assert kept is not None and kept.stat().st_ino == p.stat().st_ino
    assert last_good_disk_bytes(ck) == 0
    _ckpt(ck, b"b" * 100_000)  # the next save, by rename: the kept version now holds its bytes alone
    assert kept.read_bytes() == b"a" * 100_000
    assert last_good_disk_bytes(ck) >= 100_000


def test_a_version_over_the_size_cap_is_not_kept(tmp_path):
    ck = tmp_path / "ck"
    p = _ckpt(ck, b"a" * 10_000)
    assert preserve_last_good(p, link=True, max_bytes=9_999) is None
    assert not (ck / "last_good" / "ckpt.pt").exists()
    assert preserve_last_good(p, max_bytes=10_000) is not None  # at the cap: kept


def test_a_reflink_shares_the_extents_where_the_filesystem_clones(tmp_path):
    if not _reflinks(tmp_path):
        pytest.skip("no reflinks on this filesystem (ext4, tmpfs): btrfs or XFS with reflink=1 needed")
    ck = tmp_path / "ck"
    p = _ckpt(ck, b"a" * 100_000)
    kept = preserve_last_good(p)
    assert kept is not None and kept.read_bytes() == p.read_bytes() and kept.stat().st_ino != p.stat().st_ino


def test_a_bad_mark_holds_for_the_version_it_was_given_to_not_the_next_save_at_that_path(tmp_path):
    from supervisor.checkpoints.selection import CheckpointBook

    ck = tmp_path / "ck"
    p = _ckpt(ck, b"corrupt")
    book = CheckpointBook(tmp_path)
    book.mark_bad(p, "load test failed")
    assert book.is_bad(p) and CheckpointBook(tmp_path).is_bad(p) and p in book.bad_paths()
    os.utime(p, ns=(1, 1))  # another version at the same path (the next save, or a restored copy)
    assert not book.is_bad(p) and book.bad_reason(p) is None and p not in book.bad_paths()
    book.mark_bad("/nowhere/step_1.pt", "gone")  # a path without a file: marked as before
    assert book.is_bad("/nowhere/step_1.pt")


@pytest.mark.parametrize("link", [False, True], ids=["copy", "hard link"])
def test_a_version_that_changes_while_it_is_kept_does_not_replace_the_last_good_copy(tmp_path, link):
    """The job may save again between the load test and the copy: the copy made of the new,
    unverified bytes is dropped and the previous last good copy stays."""
    ck = tmp_path / "ck"
    p = _ckpt(ck, b"a" * 100_000)
    kept = preserve_last_good(p, link=link)
    assert kept is not None
    _ckpt(ck, b"b" * 50_000)  # the next save: the caller verified "a", not this
    looks = iter([True, False])  # unchanged before the copy, changed once it is made
    assert preserve_last_good(p, link=link, unchanged=lambda: next(looks)) is None
    assert kept.read_bytes() == b"a" * 100_000
    assert [e.name for e in (ck / "last_good").iterdir() if e.name.startswith(".")] == []  # no temp left
    assert preserve_last_good(p, link=link, unchanged=lambda: False) is None  # changed before: nothing copied
    assert kept.read_bytes() == b"a" * 100_000
