"""What a standby's code was read from, and whether a cold start would now read the same (issue 34
part 6: a pre-warmed restart never runs stale code).

An operator restarts a job, most often, because something was upgraded or hot-fixed: a package
reinstalled, a file of it edited, a ``.pth`` file added. A standby that imported the old files
holds the old code; a cold start would load the new. So the standby keeps each imported module's
file identity (size, mtime_ns, ctime_ns, inode) from just after its import, and the state of every
``sys.path`` folder (each ``.pth`` file's identity; which ``*.dist-info``/``*.egg-info`` are there),
and at the hand-over compares them again: any difference and the attempt starts cold, its reason
``code changed (<module>)``.

Cheap and bounded: stat calls, plus one directory listing per ``sys.path`` entry (at most
``MAX_DIR_ENTRIES`` read each); at most ``MAX_CODE_FILES`` files kept (a torch job imports about
2,000; a stat costs about 2 µs). A standby past that bound does not guess: it starts the attempt
cold and says so.

Standard library only, and loaded by the standby runner by path (never imported as part of the
supervisor into the job: the job's ``sys.modules`` holds nothing of it).
"""
from __future__ import annotations

import os
import sys
from importlib.machinery import PathFinder

MAX_CODE_FILES = 20_000
MAX_DIR_ENTRIES = 20_000
DIST_SUFFIXES = (".dist-info", ".egg-info", ".egg-link")

TYPE_CHECKING = False  # typing is not imported into the job (nor is anything evaluated here at run time)
if TYPE_CHECKING:
    Identity = tuple[int, int, int, int]  # size, mtime_ns, ctime_ns, inode


def file_identity(path: str) -> Identity | None:
    """The file's (size, mtime_ns, ctime_ns, inode); None when it is gone or cannot be stat'ed.
    The ctime is what an in-place edit of the same size with its mtime put back (``os.utime``,
    ``touch -r``, ``cp -p``, ``rsync -t``) still moves: no user can set it back."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


def path_state(entries: list[str]) -> dict[str, Identity | str | None]:
    """What the import system reads of each sys.path entry besides the modules: every ``.pth``
    file (site runs them at start) by identity, every installed distribution's metadata folder
    by name (pip adds one, renames it on an upgrade, removes it), a zip entry's own identity."""
    state: dict[str, Identity | str | None] = {}
    for entry in entries:
        full = os.path.abspath(entry or ".")
        if os.path.isfile(full):
            state[full] = file_identity(full)
            continue
        try:
            with os.scandir(full) as it:
                for i, e in enumerate(it):
                    if i >= MAX_DIR_ENTRIES:
                        # Too many to list: the folder's own identity (its mtime moves when an
                        # entry is added or removed) stands for the rest.
                        state[full] = file_identity(full)
                        break
                    if e.name.endswith(".pth"):
                        state[e.path] = file_identity(e.path)
                    elif e.name.endswith(DIST_SUFFIXES):
                        state[e.path] = "present"
        except OSError:
            state[full] = None  # absent now; one that appears later is a change
    return state


class CodeSeen:
    """The files this process's code came from, as they were when it was imported."""

    def __init__(self) -> None:
        self.entries = list(sys.path)
        self.paths = path_state(self.entries)
        self.files: dict[str, tuple[str, Identity | None]] = {}  # file -> (module, identity)
        self._names: set[str] = set()
        self.raced: str | None = None  # a module whose file changed while it was being imported
        self._before: dict[str, Identity | None] = {}  # file -> its identity before the import read it
        self.note()

    def before(self, name: str) -> None:
        """Before the standby imports ``name``: its file's identity, found as the import will find
        it but without importing anything (a dotted name only once its parent is imported). The
        identity :meth:`note` takes after the import is then no proof on its own: a file replaced
        while its module was being imported (an upgrade landing during the warm-up, a window a
        loaded machine makes long) shows as a difference, and the standby is not used."""
        head, _, tail = name.rpartition(".")
        if name in sys.modules or len(self._before) > MAX_CODE_FILES:
            return
        try:
            parent = sys.modules.get(head) if head else None
            if head and parent is None:
                return
            spec = PathFinder.find_spec(name, getattr(parent, "__path__", None) if parent else None)
        except Exception:  # a finder's own error: the import will say it
            return
        origin = getattr(spec, "origin", None) if spec is not None else None
        if isinstance(origin, str) and os.path.isabs(origin):
            self._before[origin] = file_identity(origin)

    def note(self) -> None:
        """Every module imported since the last call, its file's identity now. Called right after
        each import, before anything else runs; a file whose identity moved between :meth:`before`
        and now was replaced while it was read (``raced``)."""
        for name, mod in list(sys.modules.items()):
            if name in self._names:
                continue
            self._names.add(name)
            path = getattr(mod, "__file__", None)
            if isinstance(path, str) and path not in self.files and len(self.files) <= MAX_CODE_FILES:
                ident = file_identity(path)
                self.files[path] = (name, ident)
                if path in self._before and self._before.pop(path) != ident and self.raced is None:
                    self.raced = name

    def changed(self) -> str | None:
        """Why a cold start would load other code than this process holds; None when it would not."""
        self.note()
        if self.raced is not None:
            return f"code changed ({self.raced}: its file changed while the standby imported it)"
        if len(self.files) > MAX_CODE_FILES:
            return f"more than {MAX_CODE_FILES} module files to compare"
        for path, (name, ident) in self.files.items():
            if file_identity(path) != ident:
                return f"code changed ({name})"
        now = path_state(self.entries)
        for key in sorted(self.paths.keys() | now.keys()):
            if self.paths.get(key, "absent") != now.get(key, "absent"):
                return f"code changed ({os.path.basename(key)} in {os.path.dirname(key)})"
        return None
