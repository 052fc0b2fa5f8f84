"""Move bad checkpoints aside (never delete) and keep a copy of the last good overwritten one.

``quarantine(path, reason, layout)`` renames the checkpoint (file or folder) and the sidecar
files its layout names (its manifest) into ``quarantine/`` beside it, with
``<name>.quarantine.json`` saying why, when and by whom. ``preserve_last_good(path)`` copies a
checkpoint of a layout that ``keeps_last_good`` (nanoGPT's overwritten ``ckpt.pt``) to
``last_good/`` (with its manifest) so a bad overwrite cannot destroy the only good state;
``restore_last_good`` puts such a copy back where the job reads it.
"""
from __future__ import annotations

import datetime as _dt
import getpass
import json
import os
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import structlog

from .discovery import LAST_GOOD_DIR, NOTE_SUFFIX, QUARANTINE_DIR, Layout
from .layouts import registry
from .manifest import MAX_MANIFEST_BYTES, fsync_dir, manifest_path, read_capped, stat_record, write_json_atomic
from ..ownpaths import own_dir_fd
from .reflink import clone_file, copy_contents
from .snapshot import DEFAULT_HEADROOM, Headroom, NotKeptError, copy_room_problem

log = structlog.get_logger("supervisor.checkpoints")


@dataclass(frozen=True)
class QuarantineRecord:
    source: Path
    dest: Path
    note: Path
    reason: str
    at: str  # ISO time, UTC


def _free_name(folder: Path, name: str) -> Path:
    dest = folder / name
    if not dest.exists() and not manifest_path(dest).exists():
        return dest
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
    i = 0
    while True:
        cand = folder / (f"{stamp}-{name}" if i == 0 else f"{stamp}-{i}-{name}")
        if not cand.exists() and not manifest_path(cand).exists():
            return cand
        i += 1


def _who() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # no user name in some containers
        user = str(os.getuid())
    return f"transformer-supervisor (pid {os.getpid()}, {user}@{socket.gethostname()})"


def quarantine(path: Path, reason: str, layout: Layout | str | None = None) -> QuarantineRecord:
    """Move ``path`` and its layout's sidecars (its manifest) into ``quarantine/`` beside it;
    raises OSError if it cannot."""
    path = Path(path)
    sidecars = [p for p in registry.sidecars(path, layout) if p.exists()]
    qdir = path.parent / QUARANTINE_DIR
    qfd = own_dir_fd(qdir)
    try:
        # Moved into the folder just checked (/proc/self/fd/<fd>/<name>), never through the name
        # quarantine/, which could be swapped for a link meanwhile (ownpaths).
        held = Path(f"/proc/self/fd/{qfd}")
        name = _free_name(held, path.name).name
        dest, at = qdir / name, _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        note = dest.with_name(name + NOTE_SUFFIX)
        # The note first: if the move fails, a note about an absent file is harmless; a moved file
        # without a note would be a mystery.
        write_json_atomic(held / note.name, {"original_path": str(path), "quarantined_path": str(dest),
                                             "reason": reason, "at": at, "by": _who()})
        os.rename(path, held / name)  # same filesystem (a sibling dir): atomic, nothing copied or lost
        for side in sidecars:  # <name><suffix> beside it -> <dest name><suffix>
            os.rename(side, held / (name + side.name[len(path.name):]))
        os.fsync(qfd)
    finally:
        os.close(qfd)
    fsync_dir(path.parent)
    log.warning("checkpoint_quarantined", path=str(path), dest=str(dest), reason=reason,
                next="it is kept (never deleted); selection moves on to the next older ready checkpoint")
    return QuarantineRecord(source=path, dest=dest, note=note, reason=reason, at=at)


def last_good_path(path: Path) -> Path:
    return path.parent / LAST_GOOD_DIR / path.name


def preserve_last_good(path: Path, link: bool = False, max_bytes: int = 0,
                       unchanged: Callable[[], bool] | None = None, headroom: Headroom = DEFAULT_HEADROOM) -> Path | None:
    """Keep ``path`` (a verified single overwritten checkpoint) and its manifest in ``last_good/``.

    The copy goes to a temp name first and is renamed over the previous copy, so a crash
    mid-copy leaves the previous last good copy intact. How, cheapest first: ``link`` (the job
    replaces the file by rename, each save a new inode) a hard link, no bytes until the next save
    (never for a job that rewrites the file in place: the link would be overwritten with it);
    else a reflink where the filesystem clones (shared extents); else a copy, only within
    ``headroom`` (snapshot.copy_room_problem: NotKeptError, the temp file removed). ``max_bytes`` (0: no
    limit): a bigger version is not kept at all, since any kept version holds its size on disk once
    the job saves the next one. ``unchanged``: whether ``path`` still holds the version that was
    verified; asked again once the copy is made, before it replaces the previous one, since a
    running job may overwrite the file meanwhile (a copy of its next, unverified save must never
    become the last good one). Returns the copy's path, or None when skipped.
    """
    path = Path(path)
    size = path.stat().st_size if path.is_file() else stat_record(path)["size"]
    if max_bytes and size > max_bytes:
        log.info("checkpoint_last_good_skipped", path=str(path), size=size, max_bytes=max_bytes,
                 next="this version is not kept (checkpoints.last_good_max_bytes); a bad overwrite of it "
                      "falls back to an older checkpoint")
        return None
    dest = last_good_path(path)
    if unchanged is not None and not unchanged():
        _changed_while_kept(path, None)
        return None
    lg = own_dir_fd(dest.parent)
    try:
        # From here on through the folder just checked (/proc/self/fd/<fd>/<name>), never through
        # the name last_good/, which could be swapped for a link meanwhile (ownpaths).
        return _keep(path, size, Path(f"/proc/self/fd/{lg}") / dest.name, dest, link, unchanged, headroom)
    finally:
        os.close(lg)


def _keep(path: Path, size: int, dest: Path, shown: Path, link: bool, unchanged: Callable[[], bool] | None,
          headroom: Headroom) -> Path | None:
    """preserve_last_good's copy into ``dest`` (in the held folder); ``shown``: its real path."""
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    how = "copy"
    if link and path.is_file():
        try:
            if tmp.exists():
                tmp.unlink()  # our own leftover temp name
            os.link(path, tmp)
            if unchanged is not None and not unchanged():
                _changed_while_kept(path, tmp)
                return None
            os.replace(tmp, dest)
            how = "hard link"
        except OSError:
            pass  # another filesystem, or links refused: clone or copy
    if how == "hard link":
        pass
    elif path.is_dir():
        if tmp.exists():
            shutil.rmtree(tmp)  # our own leftover temp copy, never a checkpoint
        shutil.copytree(path, tmp)
        if unchanged is not None and not unchanged():
            _changed_while_kept(path, tmp)
            return None
        if dest.exists():
            old = _free_name(dest.parent, f"previous-{dest.name}")
            os.rename(dest, old)  # kept, never deleted
        os.rename(tmp, dest)
    else:
        done = False
        try:
            try:
                cloned = clone_file(path, tmp)
            except OSError:
                cloned = False  # e.g. no room for the clone's metadata: the copy's rule decides
            if cloned:
                how = "reflink"
            else:
                problem = copy_room_problem(dest.parent, size, headroom)
                if problem:
                    raise NotKeptError(problem)
                with open(path, "rb") as src, open(tmp, "wb") as dst:
                    copy_contents(src.fileno(), dst.fileno())
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            shutil.copystat(path, tmp)
            if unchanged is not None and not unchanged():
                _changed_while_kept(path, tmp)
                return None
            os.replace(tmp, dest)
            done = True
        finally:
            if not done:
                tmp.unlink(missing_ok=True)  # a failed copy never leaves its temp file behind
    data = _manifest_data(manifest_path(path))
    if data is not None:
        data["copied_from"] = str(path)
        write_json_atomic(manifest_path(dest), data)
    fsync_dir(dest.parent)
    log.info("checkpoint_preserved_last_good", path=str(path), copy=str(shown), how=how,
             disk_bytes=size if how == "copy" and not path.is_dir() else 0,
             next="a bad overwrite of the original can no longer destroy the last good state")
    return shown


def _changed_while_kept(path: Path, tmp: Path | None) -> None:
    """The job overwrote ``path`` after it was verified (before or while it was kept): drop our
    own temp copy (never a checkpoint) and keep the previous last good copy."""
    if tmp is not None:
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
    log.info("checkpoint_last_good_not_kept", path=str(path),
             reason="the file changed after it was verified (the job saved again)",
             next="the previous last good copy stays; the new version is kept once it passes its own load test")
    return None


def last_good_disk_bytes(checkpoint_dir: Path) -> int | None:
    """Bytes on disk that only ``last_good/`` holds (None without one): a hard link to the file
    the job still has costs nothing; one whose original the job has since replaced, and a copy,
    cost their allocated size. A reflink counts in full (stat cannot see shared extents): an
    upper bound."""
    lg = Path(checkpoint_dir) / LAST_GOOD_DIR
    try:
        entries = list(os.scandir(lg))
    except OSError:
        return None
    total = 0
    for e in entries:
        try:
            if e.name.startswith(".") or not e.is_file(follow_symlinks=False):
                continue  # temp names, folders (copied folder checkpoints are rare; counted as 0)
            st = e.stat(follow_symlinks=False)
            try:
                live = os.stat(Path(checkpoint_dir) / e.name)
                if (live.st_dev, live.st_ino) == (st.st_dev, st.st_ino):
                    continue
            except OSError:
                pass
            total += st.st_blocks * 512
        except OSError:
            continue  # replaced while we looked
    return total


class LastGoodKeeper:
    """Keeps each verified version of a single overwritten checkpoint in last_good/: a hard link
    once the job was seen replacing the file by rename (a new inode per save), else a copy."""

    def __init__(self, max_bytes: int = 0, headroom: Headroom = DEFAULT_HEADROOM) -> None:
        self.max_bytes = max_bytes
        self.headroom = headroom
        self._inodes: dict[Path, int] = {}  # inode of the last version seen (rename vs in place)

    def replaced_by_rename(self, path: Path, inode: int) -> bool:
        """Note the inode of ``path``'s version now; True once the job was seen replacing the file
        by rename (a new inode per save), so a hard link to a version keeps that version."""
        prev = self._inodes.get(path)
        self._inodes[path] = inode
        return prev is not None and prev != inode

    def keep(self, path: Path, unchanged: Callable[[], bool] | None = None) -> Path | None:
        """``path``'s version to last_good/ unless already there; the copy's path, or None
        (``unchanged``: see :func:`preserve_last_good`)."""
        st = path.stat()
        lg = last_good_path(path)
        if lg.exists() and lg.stat().st_mtime_ns == st.st_mtime_ns and lg.stat().st_size == st.st_size:
            return None  # already kept
        return preserve_last_good(path, link=self.replaced_by_rename(path, st.st_ino), max_bytes=self.max_bytes,
                                  unchanged=unchanged, headroom=self.headroom)

    def keep_version(self, path: Path, version: Any, version_of: Callable[[Path], Any]) -> Path | None:
        """Keep ``path`` only while it holds ``version``, the one that was verified (None: that
        version is no longer on disk): a running job may save, or be caught mid-save, between
        the verification and the copy, and the last good copy is what a bad overwrite falls back to."""
        if version is None:
            _changed_while_kept(path, None)
            return None
        return self.keep(path, unchanged=lambda: version_of(path) == version)


def restore_last_good(copy: Path, original: Path) -> None:
    """Put a last_good/ copy (and its manifest) back at ``original``, where the job resumes from
    (nanoGPT reads out_dir/ckpt.pt). ``original`` must be gone (moved to quarantine/)."""
    tmp = original.with_name(f".{original.name}.restore.tmp")
    shutil.copy2(copy, tmp)
    os.replace(tmp, original)
    data = _manifest_data(manifest_path(copy))
    if data is not None:
        write_json_atomic(manifest_path(original), data)
    log.info("checkpoint_restored_last_good", copy=str(copy), to=str(original),
             next="the job resumes from its usual path")


def _manifest_data(mp: Path) -> dict[str, Any] | None:
    """A manifest's JSON object to carry along with a copy, or None: absent, over
    MAX_MANIFEST_BYTES, not a regular file, or not a JSON object (the copy goes without it)."""
    try:
        raw = read_capped(mp, MAX_MANIFEST_BYTES)
        data = json.loads(raw) if raw is not None else None
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
