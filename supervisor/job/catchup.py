"""Where the daemon's reading of the job's output stands against the job: the lag, and the bytes
it reads back from job.log when the keeper sent their place instead of the bytes.

The keeper (:mod:`.keeper`) never waits for the daemon: when the daemon's parsers fall more than
a bounded queue behind, the keeper sends gap frames (stream, offset, length in job.log, when
read) and the daemon reads those bytes back from job.log here, in order, at its own pace.
:class:`LagGauge` keeps how far behind that reading is (seconds since the keeper read the chunk
being handled, bytes of job.log not yet handled), for ``status`` and the metrics endpoint.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import structlog

from .keeper import CHUNK, GAP_HEAD, GAP_RANGE, NOT_IN_LOG, rotated_logs

log = structlog.get_logger("supervisor.job.output")


@dataclass(frozen=True)
class OutputLag:
    """How far the daemon's reading of the job's output is behind the job.

    ``seconds``: since the keeper read the chunk being handled now (0 when all is handled);
    ``bytes``: of job.log not handled yet; ``max_seconds``: the most this attempt was behind;
    ``unparsed_bytes``: output the parsers never saw (in job.log, but rotated or truncated away
    before they caught up; said in an ``output_unparsed`` event); ``draining``: output the job
    printed before its leader exited is still being handled (the exit waits for it)."""

    seconds: float = 0.0
    bytes: int = 0
    max_seconds: float = 0.0
    unparsed_bytes: int = 0
    draining: bool = False

    def as_status(self) -> dict[str, float | int]:
        return {"seconds": round(self.seconds, 3), "bytes": self.bytes, "max_seconds": round(self.max_seconds, 3),
                "unparsed_bytes": self.unparsed_bytes}


class LagGauge:
    """Written by the output thread alone (:meth:`handling`, :meth:`handled`, :meth:`idle`);
    read from any thread (:meth:`lag`: attribute reads, no lock)."""

    def __init__(self, log_path: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.log_path = log_path
        self._clock = clock  # the keeper stamps chunks with CLOCK_MONOTONIC: the same clock
        self._at: float | None = None  # when the keeper read the chunk being handled
        self._end = -1  # where in job.log the handled output ends (from the attempt's start: the log is appended)
        try:
            self._end = os.stat(log_path).st_size if log_path else -1
        except OSError:
            pass
        self.max_seconds = 0.0
        self.unparsed = 0
        self.read_back = 0  # bytes read back from job.log (the keeper sent their place, not them)
        self._logs_at_start = _logs_size(log_path)  # job.log and its rotations: earlier attempts' bytes

    def unread(self, handled: int) -> int:
        """Bytes this attempt's keeper wrote to job.log (rotated ones too) that are not among the
        ``handled`` ones; across rotations, where an offset alone cannot say (fewer when a
        rotation dropped the oldest log since the start)."""
        return max(0, _logs_size(self.log_path) - self._logs_at_start - handled)

    def handling(self, read_at: float) -> None:
        self._at = read_at

    @property
    def end(self) -> int:
        """Where the handled output ends in job.log (-1: unknown)."""
        return self._end

    def behind(self) -> float:
        """Seconds since the keeper read the chunk being handled now (0 when all is handled)."""
        at = self._at
        return 0.0 if at is None else max(0.0, self._clock() - at)

    def handled(self, end: int) -> None:
        """The chunk is handled (console, parsers); ``end``: where it ends in job.log."""
        if end != NOT_IN_LOG:
            self._end = end
        if self._at is not None:
            behind = self._clock() - self._at
            if behind > self.max_seconds:
                self.max_seconds = behind

    def rotated(self) -> None:
        """The keeper rotated job.log: what follows ends at offsets in the new file."""
        self._end = 0

    def idle(self) -> None:
        """Everything the keeper sent is handled."""
        self._at = None

    def lag(self, exited_at: float | None = None) -> OutputLag:
        """``exited_at``: when the job's leader was seen gone (this clock): output read before it
        that is still being handled makes the lag ``draining``."""
        at, end = self._at, self._end
        if at is None:
            return OutputLag(max_seconds=self.max_seconds, unparsed_bytes=self.unparsed)
        size = 0
        if self.log_path and end >= 0:
            try:
                size = max(0, os.stat(self.log_path).st_size - end)
            except OSError:
                size = 0
        seconds = max(0.0, self._clock() - at)
        return OutputLag(seconds, size, max(seconds, self.max_seconds), self.unparsed,
                         exited_at is not None and at <= exited_at)


def _logs_size(log_path: str) -> int:
    if not log_path:
        return 0
    total = 0
    for path in [log_path, *rotated_logs(log_path)]:
        try:
            total += os.stat(path).st_size
        except OSError:
            continue
    return total


class LogReadback:
    """Reads a gap frame's ranges back from job.log: only from the file the keeper wrote them to
    (its device and inode), never through a symlink; job.log, or the rotated job.log.1 ... it has
    become since (the keeper's own rotation renames it while the daemon catches up). A range that
    cannot be read whole (rotated out of the kept ones, truncated by copytruncate) is counted in
    ``gauge.unparsed`` and said."""

    def __init__(self, log_path: str, gauge: LagGauge) -> None:
        self.log_path = log_path
        self.gauge = gauge
        self._fd = -1
        self._ident = (0, 0)

    def _open(self, ident: tuple[int, int]) -> int:
        if self._fd >= 0 and self._ident == ident:
            return self._fd
        self.close()
        if not self.log_path:
            return -1
        for path in [self.log_path, *rotated_logs(self.log_path)]:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            except OSError:
                continue
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) == ident:
                self._fd, self._ident = fd, ident
                return fd
            os.close(fd)  # another file: the ranges are in the one the keeper wrote them to
        return -1

    def ranges(self, payload: bytes) -> Iterator[tuple[int, bytes]]:
        """The gap's output, (stream, bytes) in the order the keeper read it."""
        ident = GAP_HEAD.unpack_from(payload)
        fd = self._open((int(ident[0]), int(ident[1])))
        lost = 0
        for pos in range(GAP_HEAD.size, len(payload) - GAP_RANGE.size + 1, GAP_RANGE.size):
            kind, off, length, read_at = GAP_RANGE.unpack_from(payload, pos)
            self.gauge.handling(read_at)
            got = 0
            while fd >= 0 and got < length:
                try:
                    piece = os.pread(fd, min(CHUNK, length - got), off + got)
                except OSError:
                    piece = b""
                if not piece:
                    break
                got += len(piece)
                self.gauge.read_back += len(piece)
                yield kind, piece
                self.gauge.handled(off + got)
            lost += length - got
        if lost:
            self.gauge.unparsed += lost
            log.error("output_unparsed", path=self.log_path, bytes=lost,
                      message=f"{lost} bytes of the job's output are in {self.log_path or 'job.log'} (or the file "
                              "it was rotated to) but could not be read back for the parsers: it was moved or "
                              "truncated before they caught up; they are not parsed, the rest of the output is")

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = -1


# A non-finite value as a job prints one (nan, NaN, inf, -inf, Infinity: Python, JSON, C): the
# look-ahead's prefilter, one C pass over the new bytes. Words that hold them ("info", "nanoGPT")
# do not match; a line that only speaks of NaN does, and is then judged as any line is.
NONFINITE = re.compile(rb"(?i)\b(?:nan|inf(?:inity)?)\b")
# A hit right after a metric key (loss, norm: the NaN detector's fields; "nan iterations") with only
# separators, quotes or a torch wrapper between: a value's place. Such hits are judged first when a
# look holds more than AHEAD_MAX_HITS ("step 9 loss 1.99 (no nan)" x 200,000 must not crowd out
# "step 10 loss nan"); the others after them, within the cap.
VALUE_AT = re.compile(rb"(?i)(?:loss|norm|iterations)[\w/.\]\)]*['\"]?\s*[=:|]?\s*['\"]?(?:tensor\(\[?)?[-+]?"
                      rb"(?:nan|inf(?:inity)?)\b")
AHEAD_CONTEXT = 16 << 10  # bytes before a hit read with it: the stream's last finite record (onset)
AHEAD_READ = 8 << 20  # at most this much new output per look (the next look goes on from there)
AHEAD_MAX_HITS = 64  # hit lines given per look; the rest are left to the in-order parsers (later, exact)
AHEAD_SHARE = 0.2  # of a core: after a look that cost t seconds of CPU, the next waits 4 t (dense hits)
AHEAD_CHEAP_S = 0.002  # a look that cost less (and met no cap) holds no later one back
STDERR_SEEN = 4096  # stderr hit lines remembered to tell a job.log hit's stream


class AheadLines(Sequence[str]):
    """A hit line and the lines before it (within :data:`AHEAD_CONTEXT`), decoded only when read:
    ``[-1]`` (the hit) decodes one line; iterating decodes the context once. Every hit of one look
    shares the look's buffer, so a burst of hits costs its count, never count x context (a list of
    16 KiB of decoded lines per hit took gigabytes at 200,000 hits)."""

    __slots__ = ("_data", "_first", "_start", "_end", "_lines")

    def __init__(self, data: bytes, first: int, start: int, end: int) -> None:
        self._data, self._first, self._start, self._end = data, first, start, end
        self._lines: list[str] | None = None

    def _all(self) -> list[str]:
        if self._lines is None:
            self._lines = self._data[self._first:self._end].decode("utf-8", "replace").split("\n")
        return self._lines

    def __getitem__(self, i: int) -> str:  # type: ignore[override]  # no slices: the judge reads [-1] or all
        if i == -1 and self._lines is None:
            return self._data[self._start:self._end].decode("utf-8", "replace")
        return self._all()[i]

    def __len__(self) -> int:
        return len(self._all())

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        return list(self) == (list(other) if isinstance(other, (list, tuple, AheadLines)) else other)

    def __repr__(self) -> str:
        return f"AheadLines({self._all()!r})"


class _Follower:
    """One file the keeper appends, followed by file identity from an offset: the bytes added
    since the last read. A rename (the keeper's rotation) is followed to the new file once the
    old one is read to its end; a file that shrank (copytruncate) is read again from 0."""

    def __init__(self, path: str, offset: int) -> None:
        self.path = path
        self.offset = offset
        self.floor = offset  # the attempt's output starts here: context never reaches before it
        self._fd = -1

    def _reopen(self) -> bool:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        try:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            return False
        return True

    def read_new(self, limit: int, context: int) -> tuple[bytes, int, bool]:
        """(bytes from ``offset - context`` to the end, at most ``limit`` new ones; where the new
        ones start in it; whether they start at the file's start). The caller moves ``offset``."""
        if self._fd < 0 and not self._reopen():
            return b"", 0, False
        try:
            size = os.fstat(self._fd).st_size
            if size <= self.offset:
                st = os.stat(self.path)
                here = os.fstat(self._fd)
                if (st.st_dev, st.st_ino) != (here.st_dev, here.st_ino):  # rotated: on to the new file
                    if not self._reopen():
                        return b"", 0, False
                    self.offset = self.floor = 0
                    size = os.fstat(self._fd).st_size
                elif size < self.offset:
                    self.offset = self.floor = 0  # truncated in place
            start = max(self.floor, self.offset - context)
            data = os.pread(self._fd, self.offset - start + min(limit, max(0, size - self.offset)), start)
        except OSError:
            return b"", 0, False
        return data, self.offset - start, start == self.floor

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = -1


class LogAhead:
    """The non-finite values in the output the daemon has not handled yet, found ahead of it.

    While a burst is read back (:class:`LogReadback`: the parsers seconds behind the job), a NaN
    the job printed after it would wait its turn behind every line before it: a minute after a
    million lines. :meth:`look` reads job.log from where the last look stopped to its end with one
    C pass for a non-finite token (:data:`NONFINITE`), and gives each complete line that has one
    with the lines before it (:data:`AHEAD_CONTEXT`), decoded as the splitter does, and its stream
    (a line also found in job.stderr.log is stderr's; job.log interleaves both). The lines are
    still parsed in order later; only the judgement of a NaN comes early."""

    def __init__(self, log_path: str, start: int) -> None:
        from .keeper import stderr_log_path

        self._out = _Follower(log_path, start)
        err = stderr_log_path(log_path) if log_path else ""
        try:
            err_start = os.stat(err).st_size if err else 0
        except OSError:
            err_start = 0
        self._err = _Follower(err, err_start) if err else None
        self._stderr_lines: set[bytes] = set()
        self._cpu = time.thread_time  # the look's own cost: the output thread's CPU time
        self._not_before = 0.0  # (thread CPU clock) a dense look's budget: no look before this
        self.left_in_order = 0  # hit lines past the cap per look: judged by the in-order parsers only

    def _hits(self, data: bytes, new_from: int, cap: int) -> tuple[list[tuple[int, int]], int, int]:
        """(start, end) of complete lines in ``data[new_from:]`` with a hit, in file order, at most
        ``cap`` (those with a value's place first: :data:`VALUE_AT`); how far is complete; how many
        hit lines were past the cap. Memory: the cap, whatever the hit count."""
        done = data.rfind(b"\n", new_from) + 1
        if done <= new_from:
            return [], new_from, 0
        left = 0
        hinted: list[tuple[int, int]] = []
        other: list[tuple[int, int]] = []
        end = -1
        for m in NONFINITE.finditer(data, new_from, done):
            if m.start() < end:
                continue  # a second hit on the same line
            start, end = data.rfind(b"\n", 0, m.start()) + 1, data.find(b"\n", m.end())
            if VALUE_AT.search(data, start, end):
                if len(hinted) < cap:
                    hinted.append((start, end))
                    continue
            elif len(other) < cap:
                other.append((start, end))
                continue
            left += 1
        if len(hinted) + len(other) > cap:
            left += len(hinted) + len(other) - cap
            other = other[:cap - len(hinted)]
        return sorted(hinted + other), done, left

    def skip_to(self, offset: int) -> None:
        """Output before ``offset`` in job.log is handled already: no need to look at it."""
        if offset > self._out.offset:
            self._out.offset = offset

    def look(self) -> list[tuple[str, Sequence[str]]]:
        """(stream, lines) per hit line in the output added since the last look, oldest first: the
        hit line last, the lines before it (within :data:`AHEAD_CONTEXT`) first (:class:`AheadLines`).

        Bounded whatever the hit density: at most :data:`AHEAD_MAX_HITS` hit lines a look (those with
        a value's place first: :data:`VALUE_AT`; the rest are parsed in order only, counted in
        :attr:`left_in_order`), their context read from the look's one buffer when judged, and a look
        that cost t of CPU is followed by none for t / :data:`AHEAD_SHARE` (the output waits in job.log,
        looked at by the next one). Memory: the buffer (:data:`AHEAD_READ` + context) and the cap."""
        began = self._cpu()
        if began < self._not_before:
            return []
        if self._err is not None:
            data, new_from, _ = self._err.read_new(AHEAD_READ, 0)
            spans, done, _ = self._hits(data, new_from, STDERR_SEEN)
            self._err.offset += done - new_from
            if len(self._stderr_lines) > STDERR_SEEN:
                self._stderr_lines.clear()
            self._stderr_lines.update(data[s:e] for s, e in spans)
        data, new_from, whole = self._out.read_new(AHEAD_READ, AHEAD_CONTEXT)
        spans, done, left = self._hits(data, new_from, AHEAD_MAX_HITS)
        self._out.offset += done - new_from
        self.left_in_order += left
        found: list[tuple[str, Sequence[str]]] = []
        for s, e in spans:
            if s == 0 and not whole:
                continue  # a line longer than the context: its start is not here (parsed in turn)
            # from a line's start: the file's, or after the first newline within the context
            first = 0 if whole and s <= AHEAD_CONTEXT else data.find(b"\n", max(0, s - AHEAD_CONTEXT), s) + 1
            found.append(("stderr" if data[s:e] in self._stderr_lines else "stdout", AheadLines(data, first, s, e)))
        spent = self._cpu() - began
        if left or spent > AHEAD_CHEAP_S:  # a dense or costly look: the budget holds the next ones back
            self._not_before = self._cpu() + spent * (1 / AHEAD_SHARE - 1)
        return found

    def close(self) -> None:
        self._out.close()
        if self._err is not None:
            self._err.close()
