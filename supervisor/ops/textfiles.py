"""Other runs' textfiles beside ours: a run of the same ``name`` in another file of node_exporter's
textfile directory repeats our series, and node_exporter then rejects both files' series (a scrape
error, the state of neither run). Looked at once, when the daemon starts, so that it is said
before it costs a give-up that nobody sees.

Bounded: the directory is node_exporter's, other tools write there; at most :data:`MAX_FILES`
``*.prom`` entries are looked at and :data:`HEAD_BYTES` of each (``tsup_run_info`` is among the
first series we write), regular files only, opened without blocking.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

MAX_FILES = 256
HEAD_BYTES = 64 * 1024


def _head(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return b""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""  # a FIFO or a device in node_exporter's directory is not ours to read
        return os.read(fd, HEAD_BYTES)
    except OSError:
        return b""
    finally:
        os.close(fd)


def same_name_elsewhere(textfile: str, name: str) -> list[str]:
    """The other ``*.prom`` files of ``textfile``'s directory that export a run named ``name``."""
    target = Path(textfile)
    marker = f'tsup_run_info{{name="{name}"'.encode()
    found: list[str] = []
    try:
        entries = os.scandir(target.parent)
    except OSError:
        return found  # no directory yet: writing the textfile will say so
    with entries:
        for n, entry in enumerate(entries):
            if n >= MAX_FILES:
                break
            if entry.name == target.name or not entry.name.endswith(".prom"):
                continue
            if marker in _head(Path(entry.path)):
                found.append(entry.path)
    return sorted(found)
