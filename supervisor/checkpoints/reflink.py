"""A copy-on-write clone of one file (a reflink), where the filesystem supports it.

Hand-written because it is one ioctl: Linux's ``FICLONE`` makes ``dst`` share ``src``'s extents
(btrfs, XFS with reflink=1, bcachefs, OCFS2; not ext4 or tmpfs), so keeping a verified version of
a single overwritten checkpoint costs no bytes until the job rewrites the file. Python's stdlib
has no call for it (``shutil.copyfile`` may use ``copy_file_range``, which can clone on some
filesystems but silently copies on the others, so it cannot say which happened), and no
well-kept package is worth a dependency for one ioctl.
"""
from __future__ import annotations

import errno
import fcntl
import os

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
