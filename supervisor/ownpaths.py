"""Folders the supervisor owns inside dirs it shares with the job (``last_good/``,
``quarantine/`` beside checkpoints; ``heartbeats/`` in the state dir).

They are made or entered without following a symlink: a ``last_good`` link planted by someone
else would otherwise make the daemon write checkpoint copies (or move quarantined files) wherever
it points. A symlink or non-folder there is refused with :class:`NotOurFolder`, never followed or
replaced (it may be someone's data: nothing is deleted).

Checking a folder by its name and then writing by its name leaves a gap: the name can be swapped
for a link between the two. :func:`own_dir_fd` closes it: the folder is opened once
(``O_DIRECTORY | O_NOFOLLOW``) and checked through that descriptor, and what is made in it is made
relative to the descriptor (:func:`open_in`, ``dir_fd=``/``dst_dir_fd=``), so it lands in the
folder that was checked whatever the name points to by then.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import SupervisorError

__all__ = ["NotOurFolder", "UnsafePath", "open_in", "own_dir", "own_dir_fd", "own_subdir_fd",
           "refuse_unsafe_as_root", "unsafe_component"]


class NotOurFolder(SupervisorError, OSError):
    """``path`` is a symlink or not a folder where the supervisor keeps its own folder. An OSError
    too, so callers that already report a failed copy or move report this one too."""

    code = "not_our_folder"

    def __init__(self, path: Path, what: str) -> None:
        super().__init__(f"{path} is {what}, not the supervisor's own folder; it is refused, never "
                         f"followed (remove or rename it to let the supervisor create the folder)")
        self.path = path


def file_identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of what is at ``path`` (a link itself, not followed), None when nothing is:
    whether a state dir or a ledger file is still the one opened, not one re-created by name."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _check(path: Path) -> None:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise NotOurFolder(path, f"a symlink to {os.readlink(path)!r}")
    if not stat.S_ISDIR(st.st_mode):
        raise NotOurFolder(path, "not a folder")


def own_dir(path: Path, parents: bool = False) -> Path:
    """Create ``path`` (mode 0700 from the umask's view of it) if absent; refuse a symlink or
    non-folder at that name. ``parents``: create missing parents the ordinary way (only the last
    component is ours). Returns ``path``."""
    os.close(own_dir_fd(path, parents))
    return Path(path)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def own_dir_fd(path: Path, parents: bool = False) -> int:
    """:func:`own_dir`, returning a descriptor on the folder it checked (the caller closes it):
    make files in it with :func:`open_in` or ``dir_fd=`` and they land there, whatever the name
    is swapped for after the check."""
    path = Path(path)
    if parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path)  # mkdir never follows a symlink at the last component: it fails EEXIST
    except FileExistsError:
        pass
    try:
        return os.open(path, _DIR_FLAGS)  # O_NOFOLLOW: a link at the last component fails ELOOP
    except OSError:
        _check(path)  # says what is there instead: a symlink, or not a folder
        raise


def own_subdir_fd(parent_fd: int, name: str, where: Path) -> int:
    """The folder ``name`` inside the checked folder ``parent_fd`` (made if absent), opened the same
    way; ``where`` names it in errors."""
    _one_name(name)
    try:
        os.mkdir(name, 0o777, dir_fd=parent_fd)
    except FileExistsError:
        pass
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as e:
        st = os.lstat(name, dir_fd=parent_fd)
        if stat.S_ISLNK(st.st_mode):
            raise NotOurFolder(where, "a symlink") from None
        if not stat.S_ISDIR(st.st_mode):
            raise NotOurFolder(where, "not a folder") from None
        raise e


def open_in(dir_fd: int, name: str, flags: int, mode: int = 0o600) -> int:
    """``os.open`` of ``name`` in the checked folder ``dir_fd``, never through a symlink (ELOOP)."""
    _one_name(name)
    return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)


def _one_name(name: str) -> None:
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"{name!r} is not a single file name")


class UnsafePath(SupervisorError):
    """A root daemon's state or checkpoint dir has a path component another user can change
    (see :func:`unsafe_component`): nothing was touched; exit 2."""

    code = "unsafe_path"


def unsafe_component(path: Path, uid: int) -> str | None:
    """Why another user could swap ``path`` (or a folder above it) under a daemon running as
    ``uid``, or None. Each existing component of the resolved path must be owned by root or
    ``uid``, and not writable by group or others -- except a root-owned sticky folder (/tmp,
    /var/tmp) above the dir itself: there others may create their own entries but cannot rename
    or remove ours, and a name someone else made first fails the owner test one level down."""
    real = Path(os.path.realpath(path))
    chain = [*reversed(real.parents), real]
    for comp in chain:
        try:
            st = os.stat(comp)
        except FileNotFoundError:
            break  # not made yet: the daemon creates it, as its own user
        if st.st_uid not in (0, uid):
            return f"{comp} is owned by uid {st.st_uid} (neither root nor the daemon's uid {uid})"
        writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        sticky_tmp = bool(st.st_mode & stat.S_ISVTX) and st.st_uid == 0 and comp != real
        if writable and not sticky_tmp:
            who = "others" if st.st_mode & stat.S_IWOTH else f"group {st.st_gid}"
            return f"{comp} is writable by {who} (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def refuse_unsafe_as_root(path: Path, what: str) -> None:
    """Raise :class:`UnsafePath` naming the component when the daemon runs as root and ``path``
    has one another user can change. A non-root daemon can only be hurt within what its user
    may already do, so the check is for root only."""
    uid = os.geteuid()
    if uid != 0:
        return
    why = unsafe_component(path, uid)
    if why is not None:
        raise UnsafePath(f"{what} {path} is unsafe for a root daemon: {why}; another user could swap "
                         f"it for a link to any file root can write. Use a path owned by root down to "
                         f"the dir (chown root/chmod go-w the component named); nothing was started")
