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

__all__ = ["NotOurFolder", "own_dir"]


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
