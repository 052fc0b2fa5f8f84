"""Snapshot first: a single overwritten checkpoint (nanoGPT's ``ckpt.pt``) is captured before
its load test, and the capture is what is tested and kept.

Why: a load test takes seconds (the job's Python, a torch import, a full read) and on a busy
machine longer than the job's save interval. Testing the live file and copying it afterwards
dropped every version the job overwrote during its test, so a job saving more often than a load
test took was never protected at all. A snapshot taken the moment the save settles holds that
version whatever the job does next; once its test passes it becomes ``last_good/<name>``.

How, cheapest first (none of them may make the job's own saves fail):

- a hard link, when the job was seen replacing the file by rename (a new inode per save): the old
  inode stays ours, no bytes until the job's next save. Never for a job that rewrites in place
  (the link would change with it).
- a reflink (shared extents) where the filesystem clones.
- a copy, only within the free-space headroom (:func:`copy_room_problem`): after the copy at
  least ``max(headroom_factor x the file, min_free_fraction of the filesystem)`` must stay free,
  so the job's next save (and one more) still fits. Else the version is not kept, and the caller
  says so (``checkpoint_not_kept``): never silence.

A copy's temp file is removed whatever happens (try/finally), and a copy is checked to be one
version: the source is read through one open descriptor (a save by rename leaves that inode
alone), and a size or mtime change of that inode during the copy (an in-place rewrite) drops it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .discovery import LAST_GOOD_DIR
from ..errors import SupervisorError
from .hashing import StatKey
from .reflink import clone_file, copy_contents
from ..ownpaths import open_in, own_dir_fd


class NotKeptError(SupervisorError, OSError):
    """A version that could not be captured (no room for a copy, the copy failed): ``reason`` says
    why. An OSError too, so callers that already log a failed copy keep doing so."""

    code = "not_kept"

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ChangedWhileCopied(SupervisorError):
    """The job rewrote the file in place while it was copied: not a version; taken when it settles."""


@dataclass(frozen=True)
class Headroom:
    """What a copy must leave free on the checkpoint's filesystem (the job's saves come first)."""

    factor: float = 2.0  # times the file's size
    fraction: float = 0.05  # of the filesystem's size

    def need(self, size: int, total: int) -> int:
        return int(max(self.factor * size, self.fraction * total))


DEFAULT_HEADROOM = Headroom()


@dataclass(frozen=True)
class Snapshot:
    path: Path  # the temp name in last_good/ (a dot name: never a checkpoint to discovery)
    source: Path
    version: StatKey  # the source version it holds (what version_token(source) said then)
    how: str  # "hard link", "reflink" or "copy"


def copy_room_problem(folder: Path, size: int, headroom: Headroom) -> str | None:
    """Why a copy of ``size`` bytes into ``folder`` would eat into the room the job's saves need;
    None when it fits."""
    st = os.statvfs(folder)
    free, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    need = headroom.need(size, total)
    if free - size >= need:
        return None
    return (f"no room for a copy: {size} bytes would leave {max(0, free - size)} of {total} bytes free, under the "
            f"{need} kept for the job's own saves (max({headroom.factor:g} x the file, "
            f"{headroom.fraction:.0%} of the filesystem); checkpoints.last_good_headroom_factor, "
            "checkpoints.last_good_min_free_fraction)")


def snapshot_path(path: Path) -> Path:
    """A dot name (discovery never takes it for a checkpoint) that ends like the file's own (the
    load test reads a .safetensors or a .pt by its suffix)."""
    return path.parent / LAST_GOOD_DIR / f".snap.{os.getpid()}.{path.name}"


def take_snapshot(path: Path, *, link: bool, headroom: Headroom) -> Snapshot:
    """Capture the version of ``path`` on disk now in last_good/ under a temp name. Raises
    NotKeptError (no room, copy failed: nothing left behind) or ChangedWhileCopied. The temp file
    is made relative to the last_good/ folder checked (ownpaths.own_dir_fd), never by its name."""
    tmp = snapshot_path(path)
    lg = own_dir_fd(tmp.parent)
    try:
        return _take(path, tmp, lg, link, headroom)
    finally:
        os.close(lg)


def _take(path: Path, tmp: Path, lg: int, link: bool, headroom: Headroom) -> Snapshot:
    for stale in tmp.parent.glob(f".snap.*.{path.name}"):
        _unlink_in(lg, stale.name)  # ours, left by a killed life: never a checkpoint
    if link:
        try:
            os.link(path, tmp.name, dst_dir_fd=lg)
            st = os.stat(tmp.name, dir_fd=lg, follow_symlinks=False)
            return Snapshot(tmp, path, StatKey(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns), "hard link")
        except OSError:
            _unlink_in(lg, tmp.name)  # links refused (another filesystem): clone or copy
    done = False
    try:
        with open(path, "rb") as src:
            before = os.fstat(src.fileno())
            version = StatKey(before.st_dev, before.st_ino, before.st_size, before.st_mtime_ns)
            try:  # /proc/self/fd/<folder fd>/<name>: the folder held open, not its name looked up again
                cloned = clone_file(f"/proc/self/fd/{src.fileno()}", f"/proc/self/fd/{lg}/{tmp.name}")
            except OSError:
                cloned = False
            how = "reflink"
            if not cloned:
                how = "copy"
                problem = copy_room_problem(tmp.parent, before.st_size, headroom)
                if problem:
                    raise NotKeptError(problem)
                try:
                    with os.fdopen(open_in(lg, tmp.name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666), "wb") as dst:
                        copy_contents(src.fileno(), dst.fileno())
                        dst.flush()
                        os.fsync(dst.fileno())
                except OSError as exc:
                    raise NotKeptError(f"the copy failed: {exc}") from None
            after = os.fstat(src.fileno())
            if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
                raise ChangedWhileCopied(str(path))
            os.utime(tmp.name, ns=(before.st_atime_ns, before.st_mtime_ns), dir_fd=lg, follow_symlinks=False)
        done = True
        return Snapshot(tmp, path, version, how)
    finally:
        if not done:
            _unlink_in(lg, tmp.name)  # a failed copy never leaves its temp file behind


def _unlink_in(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def discard(snap: Snapshot) -> None:
    snap.path.unlink(missing_ok=True)


def promote(snap: Snapshot) -> Path:
    """The verified snapshot becomes ``last_good/<name>`` (one rename over the previous kept
    version: a crash leaves one or the other, never neither)."""
    dest = snap.path.parent / snap.source.name
    fd = own_dir_fd(dest.parent)  # renamed within the folder checked, not through its name
    try:
        os.replace(snap.path.name, dest.name, src_dir_fd=fd, dst_dir_fd=fd)
        os.fsync(fd)
    finally:
        os.close(fd)
    return dest
