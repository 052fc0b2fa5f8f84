"""The heartbeat folder's files, read within a bound (issue 34).

``TSUP_HEARTBEAT_DIR`` is the job's to write, so whatever is in it is input the daemon does not
control, and the heartbeat monitor reads it from the main loop every ``check_interval_s``
(0.25 s). What it may cost there:

- *The listing* is one ``scandir`` pass kept open across checks, :data:`LIST_PER_CHECK` entries
  a check: a folder of 100,000 files costs a check a few milliseconds (a whole listing of it
  takes ~0.2 s on a small machine: most of a core at four checks a second), and is still seen
  whole every 100,000 / ``LIST_PER_CHECK`` checks, so a real rank's file among junk is found.
- *Names*: only the names the client writes count (``heartbeat-rank<N>.json``,
  ``metrics-rank<N>.jsonl``, digits only): a name with control bytes is never a rank's, and is
  neither read nor logged.
- *How many*: at most :data:`MAX_RANK_FILES` heartbeat files and as many metric files are
  followed. A heartbeat file that has not given a record of this attempt is forgotten once read
  (found again at the next pass), so junk under rank names cannot keep a real rank's file out
  for longer than a pass; while the followed ones are all junk the listing waits for them to be
  read (nothing is skipped).
- *Each file* is opened relative to a descriptor on the folder (itself opened without following
  a link, so a folder swapped for a link out is not read), without following a link
  (``O_NOFOLLOW``: a link out of the folder is not read) and without blocking (``O_NONBLOCK``:
  a FIFO in a file's place would otherwise hang the loop), and read only when it is a regular
  file: its first :data:`RECORD_READ` bytes (a record is 256), so a file that grows without a
  newline, or a 2 GB sparse one, costs 4 KiB a check.

What is refused is said through :class:`~.quiet.QuietLog` (once per 300 s a name, 120 an hour).
The metric files found are handed to the monitor's :class:`~.tail.FileTailer` by path (no glob
over the folder on the tail thread), which follows them without following links.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from typing import Iterator, Mapping

from .quiet import QuietLog

#: Folder entries looked at a check (0.25 s): ~2 ms of listing on a small machine.
LIST_PER_CHECK = 2048
#: Heartbeat files followed at once (and metric files): far above a node's ranks.
MAX_RANK_FILES = 256
#: Bytes read of a heartbeat file (the client writes a 256-byte record).
RECORD_READ = 4096

HEARTBEAT_NAME = re.compile(r"heartbeat-rank([0-9]{1,9})\.json")
METRICS_NAME = re.compile(r"metrics-rank([0-9]{1,9})\.jsonl")

_OPEN_FILE = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def positive_int(value: object) -> int | None:
    """A record's pid or world size as the client writes it (a positive int below 2**31), else None."""
    return value if type(value) is int and 0 < value < 1 << 31 else None


def missing_ranks(world: int, ranks: Mapping[int, object]) -> list[int]:
    """Up to 9 of the ranks below ``world`` that sent nothing: never a set of ``world`` ranks
    (a record may say any world size)."""
    out: list[int] = []
    for r in range(world):
        if r not in ranks:
            out.append(r)
            if len(out) > 8:
                break
    return out


class HeartbeatDir:
    """One attempt's heartbeat folder: ``read()`` each check gives ``(name, rank, head)`` of each
    heartbeat file followed; the monitor says which names gave a record (``accepted``) and which
    did not (``rejected``); ``new_metric_files()`` gives the metric files found since last asked."""

    def __init__(self, path: str, quiet: QuietLog) -> None:
        self.path = path
        self._quiet = quiet
        self.problem: str | None = None
        self._it: Iterator[os.DirEntry[str]] | None = None
        self._it_ident: tuple[int, int] | None = None
        self._known: dict[str, bool] = {}  # heartbeat name -> gave a record of this attempt
        self._metrics: set[str] = set()
        self._new_metrics: list[str] = []
        self.passes = 0  # complete passes through the folder (tests: the whole folder was seen)

    def close(self) -> None:
        self._end_pass()

    def accepted(self, name: str) -> None:
        if name in self._known:
            self._known[name] = True

    def rejected(self, name: str) -> None:
        """No record of this attempt in it: forgotten unless it gave one before (a torn read of a
        real rank's file is judged on the next read)."""
        if not self._known.get(name, True):
            del self._known[name]

    def new_metric_files(self) -> list[str]:
        out, self._new_metrics = self._new_metrics, []
        return out

    def read(self) -> list[tuple[str, int, bytes]]:
        try:
            fd = os.open(self.path, _OPEN_DIR)
        except FileNotFoundError:
            self.problem = "heartbeat directory does not exist (yet)"
            return []
        except OSError as exc:
            self.problem = f"heartbeat directory unreadable: {exc}"
            return []
        try:
            self.problem = None
            self._list(fd)
            return [r for r in (self._head(fd, name) for name in list(self._known)) if r is not None]
        finally:
            os.close(fd)

    def _end_pass(self) -> None:
        it, self._it = self._it, None
        if it is not None:
            it.close()  # type: ignore[attr-defined]  # os.scandir's iterator

    def _list(self, fd: int) -> None:
        st = os.fstat(fd)
        ident = (st.st_dev, st.st_ino)
        if self._it is not None and ident != self._it_ident:
            self._end_pass()  # the folder was replaced: a new pass through the new one
        if self._it is None:
            try:
                self._it, self._it_ident = os.scandir(fd), ident
            except OSError as exc:
                self.problem = f"heartbeat directory unreadable: {exc}"
                return
        for _ in range(LIST_PER_CHECK):
            if len(self._known) >= MAX_RANK_FILES and not all(self._known.values()):
                return  # junk under rank names: wait for its read to forget it, skip nothing
            try:
                entry = next(self._it)
            except StopIteration:
                self._end_pass()
                self.passes += 1
                return
            except OSError as exc:
                self._end_pass()
                self.problem = f"heartbeat directory unreadable: {exc}"
                return
            self._found(entry.name)

    def _found(self, name: str) -> None:
        if HEARTBEAT_NAME.fullmatch(name):
            if name in self._known:
                return
            if len(self._known) < MAX_RANK_FILES:
                self._known[name] = False
            else:
                self._quiet.say("warning", "heartbeat_files_capped", self.path, limit=MAX_RANK_FILES,
                                next=f"only {MAX_RANK_FILES} heartbeat files are followed; a rank past them "
                                     "is not watched by its heartbeat")
        elif METRICS_NAME.fullmatch(name) and name not in self._metrics:
            if len(self._metrics) < MAX_RANK_FILES:
                self._metrics.add(name)
                self._new_metrics.append(os.path.join(self.path, name))
            else:
                self._quiet.say("warning", "heartbeat_files_capped", self.path + "#metrics", limit=MAX_RANK_FILES,
                                next=f"only {MAX_RANK_FILES} client metric files are read; the others are not")

    def _head(self, dir_fd: int, name: str) -> tuple[str, int, bytes] | None:
        try:
            fd = os.open(name, _OPEN_FILE, dir_fd=dir_fd)
        except FileNotFoundError:
            del self._known[name]  # gone: its rank (if any) ages as one that stopped beating
            return None
        except OSError as exc:
            # ELOOP: a link in the file's place, not followed (it may lead out of the folder).
            why = "a link (not followed)" if exc.errno == errno.ELOOP else repr(exc)
            self._refuse(name, why)
            return None
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                self._refuse(name, _kind(mode))
                return None
            head = os.read(fd, RECORD_READ)
        except OSError as exc:
            self._refuse(name, repr(exc))
            return None
        finally:
            os.close(fd)
        m = HEARTBEAT_NAME.fullmatch(name)
        assert m is not None  # only such names are known
        return name, int(m.group(1)), head

    def _refuse(self, name: str, why: str) -> None:
        self._quiet.say("warning", "heartbeat_file_refused", os.path.join(self.path, name), why=why,
                        next="not read; the rank's hang is judged by the heartbeats it does send")
        self.rejected(name)


__all__ = ["HeartbeatDir", "LIST_PER_CHECK", "MAX_RANK_FILES", "RECORD_READ", "missing_ranks", "positive_int"]
