"""Reading a file by a name someone else may have put something else at: the state dir's ledger,
job log and lock file as the CLI reads them (often as root), the checkpoint caches beside them.

Only a regular file is read: a symlink is never followed (a ``job.log`` linked to /etc/shadow
would print it), a FIFO never opened for a blocking read (``open`` of a FIFO waits for a writer
forever, and SQLite's open of one cannot be interrupted), a folder or device never read. The name
is looked at first (``lstat``: nothing but a regular file is opened at all, so opening a device
has no side effect), then opened ``O_NOFOLLOW | O_NONBLOCK`` and checked again through the
descriptor, so a name swapped between the two is not read either. What is there instead is said
by :class:`NotARegularFile`: "ledger.sqlite is a FIFO, not a ledger".
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

from .errors import SupervisorError

__all__ = ["NotARegularFile", "check_regular", "open_regular", "open_regular_binary", "read_regular_text", "refused"]

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class NotARegularFile(SupervisorError, OSError):
    """``path`` is a symlink, a FIFO, a folder or a device where a regular file is read: refused,
    nothing read. An OSError (EINVAL) too, so a reader that skips an unreadable file skips this one."""

    code = "not_a_regular_file"

    def __init__(self, path: str | os.PathLike[str], what: str, found: str) -> None:
        message = (f"{path} is {found}, not {what}; it is not read (a link is never followed, a FIFO or "
                   f"a device never opened): move it aside")
        OSError.__init__(self, errno.EINVAL, message)  # errno and strerror as an OSError's
        self.path, self.found, self.message = Path(path), found, message

    def __str__(self) -> str:
        return self.message


def _found(path: str | os.PathLike[str], st: os.stat_result) -> str | None:
    """What a non-regular file is, said for people; None for a regular file."""
    if stat.S_ISREG(st.st_mode):
        return None
    if stat.S_ISLNK(st.st_mode):
        try:
            return f"a symlink (to {os.readlink(path)!r})"
        except OSError:
            return "a symlink"
    return next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")


def open_regular(path: str | os.PathLike[str], what: str = "a regular file") -> int:
    """A blocking read-only descriptor on ``path`` when it is a regular file (the caller closes it).
    FileNotFoundError when nothing is there, :class:`NotARegularFile` for anything but a regular
    file, another OSError (permissions) as ``os.open`` raises it."""
    found = _found(path, os.lstat(path))
    if found is not None:
        raise NotARegularFile(path, what, found)
    try:
        fd = os.open(path, _FLAGS)
    except OSError as e:
        if e.errno == errno.ELOOP:  # swapped for a link since the look
            raise NotARegularFile(path, what, "a symlink") from None
        raise
    try:
        found = _found(path, os.fstat(fd))
        if found is not None:
            raise NotARegularFile(path, what, found)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_regular(path: str | os.PathLike[str], what: str = "a regular file") -> tuple[int, int]:
    """The (device, inode) of ``path`` once :func:`open_regular` accepted it: for a reader that
    must open it by name itself (SQLite), and can compare what it opened with what was checked."""
    fd = open_regular(path, what)
    try:
        st = os.fstat(fd)
        return st.st_dev, st.st_ino
    finally:
        os.close(fd)


def refused(path: str | os.PathLike[str], what: str = "a regular file") -> str | None:
    """Why ``path`` is not read (:class:`NotARegularFile`'s message), or None: a regular file, or
    nothing there or unreadable (the reader says that its own way)."""
    try:
        check_regular(path, what)
    except NotARegularFile as e:
        return e.message
    except OSError:
        pass
    return None


def open_regular_binary(path: str | os.PathLike[str], what: str = "a regular file") -> BinaryIO:
    """:func:`open_regular` as an unbuffered binary file object (``open(path, "rb")``'s place)."""
    return os.fdopen(open_regular(path, what), "rb", buffering=0)


def read_regular_text(path: str | os.PathLike[str], what: str = "a regular file") -> str:
    """``Path(path).read_text()`` of a regular file only (UTF-8, undecodable bytes replaced)."""
    with open_regular_binary(path, what) as f:
        return f.read().decode("utf-8", "replace")
