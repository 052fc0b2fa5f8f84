"""Folders the supervisor owns inside dirs it shares with the job (``last_good/``,
``quarantine/`` beside checkpoints; ``heartbeats/`` in the state dir).

They are made or entered without following a symlink: a ``last_good`` link planted by someone
else would otherwise make the daemon write checkpoint copies (or move quarantined files) wherever
it points. A symlink or non-folder there is refused with :class:`NotOurFolder`, never followed or
replaced (it may be someone's data: nothing is deleted).
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import SupervisorError

__all__ = ["NotOurFolder", "UnsafePath", "own_dir", "refuse_unsafe_as_root", "unsafe_component"]


class NotOurFolder(OSError):
    """``path`` is a symlink or not a folder where the supervisor keeps its own folder. An OSError,
    so callers that already report a failed copy or move report this one too."""

    def __init__(self, path: Path, what: str) -> None:
        super().__init__(f"{path} is {what}, not the supervisor's own folder; it is refused, never "
                         f"followed (remove or rename it to let the supervisor create the folder)")
        self.path = path


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
    path = Path(path)
    if parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path)  # mkdir never follows a symlink at the last component: it fails EEXIST
    except FileExistsError:
        pass
    _check(path)
    return path


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
