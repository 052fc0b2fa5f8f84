"""A copy-on-write clone of one file (a reflink), where the filesystem supports it, and the
kernel-side byte copy used where it does not.

Hand-written because it is one ioctl: Linux's ``FICLONE`` makes ``dst`` share ``src``'s extents
(btrfs, XFS with reflink=1, bcachefs, OCFS2; not ext4 or tmpfs), so keeping a verified version of
a single overwritten checkpoint costs no bytes until the job rewrites the file. Python's stdlib
has no call for it (``shutil.copyfile`` may use ``copy_file_range``, which can clone on some
filesystems but silently copies on the others, so it cannot say which happened), and no
well-kept package is worth a dependency for one ioctl.

The copy (:func:`copy_contents`) moves the bytes inside the kernel (``copy_file_range``, else
``sendfile``): a checkpoint kept or quarantined passes through no buffer of the daemon's. Read
through Python, each 8 MiB chunk was a fresh allocation that glibc's malloc then kept (its mmap
threshold rises to the largest block freed): the daemon's own RSS went from 37 to 63 MiB with a
job saving a 4 MB checkpoint every 2 s.
"""
from __future__ import annotations

import errno
import fcntl
import os
from typing import Callable

# _IOW(0x94, 9, int) from <linux/fs.h>: the same number on every Linux architecture we run on.
FICLONE = 0x40049409

# What a filesystem (or a pair of them) without reflinks answers: the caller copies instead.
_UNSUPPORTED = frozenset({errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EPERM})


def clone_file(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> bool:
    """Make ``dst`` (created or truncated) a reflink of ``src``; True when the filesystem did it.
    False when it cannot (``dst`` is then removed, so the caller's copy starts clean); any
    other error (a full disk, a missing ``src``) is raised."""
    if not hasattr(fcntl, "ioctl"):
        return False
    with open(src, "rb") as s, open(dst, "wb") as d:
        try:
            fcntl.ioctl(d.fileno(), FICLONE, s.fileno())
        except OSError as e:
            if e.errno not in _UNSUPPORTED:
                raise
            ok = False
        else:
            ok = True
    if not ok:
        os.unlink(dst)
    return ok


_COPY_CHUNK = 64 * 1024 * 1024  # per system call; the kernel copies it without a user buffer
_NO_KERNEL_COPY = frozenset({errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EBADF, errno.EPERM})


def _in_kernel(copy: Callable[[int], int], off: int) -> tuple[int, bool]:
    """``copy(offset)`` until it copies nothing (the end: True) or the kernel refuses this way
    (False); the offset reached either way. Other errors (a full disk) are raised."""
    while True:
        try:
            n = copy(off)
        except OSError as e:
            if e.errno not in _NO_KERNEL_COPY:
                raise
            return off, False
        if n == 0:
            return off, True
        off += n


def copy_contents(src_fd: int, dst_fd: int) -> int:
    """Every byte of ``src_fd`` from offset 0 to its end, written at ``dst_fd``'s position (a
    fresh, empty file); the bytes copied. In the kernel where it can (``copy_file_range``, else
    ``sendfile``), else through one reused 1 MiB buffer. Errors of the copy itself (a full disk)
    are raised."""
    off, done = _in_kernel(lambda at: os.copy_file_range(src_fd, dst_fd, _COPY_CHUNK, at), 0)
    if not done:  # e.g. across filesystems on a kernel before 5.3: sendfile copies there
        off, done = _in_kernel(lambda at: os.sendfile(dst_fd, src_fd, at, _COPY_CHUNK), off)
    if done:
        return off
    buf = bytearray(1024 * 1024)
    view = memoryview(buf)
    while True:
        n = os.preadv(src_fd, [buf], off)
        if n == 0:
            return off
        written = 0
        while written < n:
            written += os.write(dst_fd, view[written:n])
        off += n
