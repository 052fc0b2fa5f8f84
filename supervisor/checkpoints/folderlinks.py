"""Links inside a checkpoint folder that lead out of it (issue 34, "never harm the run").

Every walker of a checkpoint folder lists a link to a folder without going into it: the pickle
scan, the structural checks, the scan cache's identity, hashing and the manifest's stat record,
the load test's ``os.walk``. A job does go into it: DeepSpeed resumes ``global_stepN/*.pt`` with
``weights_only=False``, so ``checkpoint-100/global_step100 -> /elsewhere/global_step100`` would
have the job unpickle files no check of ours read. What the checks cannot read whole is not called
checked, so such a checkpoint is refused: not ready, never handed to the job, never quarantined
or deleted (it is not corrupt, and what the link names is not ours to move); the reason names the
link, its target and what to do. The checkpoint dir's own listing already refuses links out of
the dir (discovery.py); this is the same rule one level down.

Which links refuse, at any depth: a link that is not a link to a regular file (a link to a file
is read as the file it names by the pickle scan, as a loader reads it) and whose target, resolved,
lies outside the checkpoint's own folder, or cannot be resolved (a loop of links). Outside the
folder includes another checkpoint beside it in the checkpoint dir: its files are deleted by the
job's rotation (``save_total_limit``) or quarantined on their own verdict, and this checkpoint's
cached verdicts would not see them change. A dangling link out refuses too: created later, its
target would be read unchecked. A link to a folder inside the checkpoint's own folder is allowed
and not followed (chosen over walking it): its target is walked where it is, by every walker and
within their budgets, so its files are read once, and a loop (``sub/up -> ..``) costs nothing.
``MAX_ENTRIES`` entries are looked at, as by the pickle scan: a folder of more is not called checked.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import SupervisorError

#: Entries (at every depth) looked at for links; past it the folder is refused (the pickle scan's bound).
MAX_ENTRIES = 100_000


class LinkedOut(SupervisorError):
    """A walk met a link out of the checkpoint: ``rel`` its place in the folder, ``why`` the reason."""

    def __init__(self, rel: str, why: str) -> None:
        super().__init__(why)
        self.rel, self.why = rel, why


def link_out(root: Path, home: Path, entry: os.DirEntry[str]) -> str | None:
    """Why the link ``entry`` under the checkpoint folder ``root`` (resolved: ``home``) keeps it
    from being checked, or None (not a link, a link to a regular file, a link that stays inside)."""
    if not entry.is_symlink():
        return None
    try:
        if entry.is_file():  # followed: a link to a regular file is scanned as that file
            return None
        target = Path(entry.path).resolve()
        kind = "a folder" if target.is_dir() else "nothing that exists now" if not os.path.lexists(target) else \
            "something that is neither a file nor a folder"
    except (OSError, RuntimeError):  # a loop of links (RuntimeError before Python 3.13)
        return (f"{os.path.relpath(entry.path, root)}: a link that cannot be resolved (a loop of links?), so the "
                "checkpoint is not called checked: not handed to the job, not moved or deleted; remove the link "
                "or make it name a folder inside the checkpoint")
    if target == home or target.is_relative_to(home):
        return None  # walked where it is (see the module's docstring)
    return (f"{os.path.relpath(entry.path, root)}: a link to {kind} outside the checkpoint ({target}): the job "
            "would load its files and no check reads them, so the checkpoint is not called checked: not handed to "
            "the job, not moved or deleted; replace the link with a copy of what it names, or resume from another "
            "checkpoint")


def folder_link_out(path: Path) -> str | None:
    """Why the checkpoint folder ``path`` is refused for a link out of it, or None (also for a
    file); see the module's docstring. Raises nothing: a folder that cannot be read is left to the
    checks that read it (they say so)."""
    try:
        if not path.is_dir():
            return None
        home = path.resolve()
    except (OSError, RuntimeError):
        return None
    seen = 0
    todo = [path]
    try:
        while todo:
            folder = todo.pop()
            entries = []
            with os.scandir(folder) as it:
                for e in it:
                    seen += 1
                    if seen > MAX_ENTRIES:
                        return (f"more than {MAX_ENTRIES:,} entries in its folders, so its links were not all looked "
                                "at: not called checked, not handed to the job, not moved or deleted; move files "
                                "out of it")
                    entries.append(e)
            for e in sorted(entries, key=lambda e: e.name):
                if e.is_dir(follow_symlinks=False):
                    todo.append(Path(e.path))
                elif why := link_out(path, home, e):
                    return why
    except OSError:
        return None
    return None


__all__ = ["MAX_ENTRIES", "LinkedOut", "folder_link_out", "link_out"]
