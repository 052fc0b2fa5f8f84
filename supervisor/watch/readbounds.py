"""The bounds every reader of a file the job writes keeps (metric files today; MLflow stores and
``*.log`` files next): one bounded line reader, an open that reads only the regular file that was
judged, and the "inside the tree" test for links.

- :class:`BoundedLines`: bytes -> complete lines, none longer than ``max_line`` held. A file that
  grows without a newline (a 2 GB sparse ``*.jsonl``) costs at most ``max_line`` bytes of memory
  however long it gets: past the cap the line is skipped to its newline, delivered as one empty
  line (it still counts as a line: a CSV's row count stays right) and counted in ``skipped``
  (once, when the cap is passed: a line never ended is said at once). :meth:`BoundedLines.flush`
  hands over the unfinished line once its writer is gone (the job's last line without a newline).
  Unlike :class:`supervisor.job.linesplit.LineSplitter` (pipes and tailed logs, for people and
  text rules) no head is delivered: half a JSON object or half a CSV row is no record.
- :func:`open_followed`: opens without blocking (a FIFO put in the file's place must not hang the
  reader) and only when the descriptor is the same regular file (device, inode) the walk judged,
  so a name swapped for a link out of the tree between the walk and the read is not read.
- :func:`inside`: whether a path (a link) resolves under one of the roots; links out are not
  followed (checkpoint discovery refuses them too).
- :func:`scan_lines`: a file's first line and its line count, read in bounded chunks (a CSV that
  exists before the run: its header and its rows, without reading 2 GB into memory).
"""

from __future__ import annotations

import os
import stat
from typing import BinaryIO, Iterable

#: The longest line of a metric file kept: a metrics line is a few hundred bytes (a few KB with
#: hundreds of keys); a longer one is no metrics line, and what a reader holds of it is bounded.
MAX_RECORD_LINE = 1 << 20
#: Bytes read from a file per read call: a huge backlog is read in several passes. What one
#: chunk becomes (lines, records) is several times its size: 1 MiB keeps that to tens of MB.
READ_CHUNK = 1 << 20


class BoundedLines:
    """Bytes -> complete lines (without their ``\\n``; a ``\\r`` before it is kept), holding at
    most ``max_line`` bytes of an unfinished one. Not thread-safe: one reader thread owns it."""

    def __init__(self, max_line: int = MAX_RECORD_LINE) -> None:
        self.max_line = max_line
        self._tail = b""
        self._dropping = False  # inside an over-long line: skip to its newline
        self.skipped = 0

    @property
    def pending(self) -> int:
        return len(self._tail)

    def reset(self) -> None:
        self._tail, self._dropping = b"", False

    def flush(self) -> list[bytes]:
        """The unfinished line as a complete one (empty list: none, or an over-long one already
        counted). Only for a writer that is gone (the job exited): its last line, written without
        a newline, is all it will ever write of it; while it runs a partial line is being written."""
        tail, dropping = self._tail, self._dropping
        self.reset()
        return [tail] if tail and not dropping else []

    def push(self, data: bytes) -> list[bytes]:
        end = data.rfind(b"\n") + 1
        if not end:  # no line ends here: hold (or keep skipping) the unfinished one
            if not self._dropping:
                if len(self._tail) + len(data) > self.max_line:
                    self._start_skipping()
                else:
                    self._tail += data
            return []
        first = data.find(b"\n") + 1
        if self._dropping:
            head = b""  # the end of the over-long line: one (empty) line still
        elif len(self._tail) + first - 1 > self.max_line:
            head = self._skip()
        else:
            head = self._tail + data[:first - 1]
        # Split at "\n" only (a "\r" inside a CSV cell or a JSON string is no line end here).
        lines = [head] + (data[first:end - 1].split(b"\n") if end > first else [])
        if len(lines) > 1 and end - first > self.max_line:
            lines = [lines[0]] + [x if len(x) <= self.max_line else self._skip() for x in lines[1:]]
        rest = data[end:]
        self._tail, self._dropping = rest, False
        if len(rest) > self.max_line:
            self._start_skipping()
        return lines

    def _start_skipping(self) -> None:
        """The unfinished line passed the cap: counted now (a file that never ends it is said
        at once), skipped to its newline."""
        self._tail, self._dropping = b"", True
        self.skipped += 1

    def _skip(self) -> bytes:
        self.skipped += 1
        return b""


def open_followed(path: str, ident: tuple[int, int]) -> BinaryIO | None:
    """``path`` opened for reading if it is still the regular file ``ident`` (device, inode), else
    None (gone, swapped for another file, a link out, a FIFO or a device)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != ident:
            os.close(fd)
            return None
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=0)
    except OSError:
        os.close(fd)
        return None


def inside(path: str, roots: Iterable[str]) -> bool:
    """Whether ``path`` resolves (links followed) to a place under one of ``roots`` (real paths)."""
    real = os.path.realpath(path)
    return any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


def scan_lines(fh: BinaryIO, end: int, max_line: int = MAX_RECORD_LINE) -> tuple[bytes, int, int]:
    """Of the first ``end`` bytes of ``fh``: the first line (without its ``\\n``; empty when it
    is longer than ``max_line`` or unfinished), the number of complete lines, and the offset just
    past the last newline. Reads ``READ_CHUNK`` at a time."""
    fh.seek(0)
    first, lines, last_end, pos = b"", 0, 0, 0
    lines_of = BoundedLines(max_line)
    while pos < end:
        data = fh.read(min(READ_CHUNK, end - pos))
        if not data:
            break
        if not lines:
            nl = data.find(b"\n")
            got = lines_of.push(data if nl < 0 else data[:nl + 1])
            first = got[0] if got else first
        n = data.count(b"\n")
        if n:
            last_end = pos + data.rfind(b"\n") + 1
        lines += n
        pos += len(data)
    return first, lines, last_end


__all__ = ["BoundedLines", "MAX_RECORD_LINE", "READ_CHUNK", "inside", "open_followed", "scan_lines"]
