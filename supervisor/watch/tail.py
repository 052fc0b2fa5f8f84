"""Follow the job's log files (``job.watch_files`` globs) and feed their lines to a LineSink.

``watchdog`` (inotify on Linux) wakes the tailer as soon as a watched directory changes; a
polling scan every ``poll_interval_s`` is the fallback (inotify limits, network file systems,
directories that do not exist yet) and catches anything an event missed.

Files are followed by identity (device, inode), with the descriptor kept open, so:

- **rename rotation** (``rank0.log`` -> ``rank0.log.1``, new ``rank0.log``): the old file is read
  to its end through the open descriptor, then the new file is read from its beginning; a rotated
  name that still matches a glob is recognised as the same file (no line read twice);
- **copytruncate**: a size below our offset means truncated; reading restarts at 0;
- **deletion**: the rest of the file is drained from the open descriptor, then it is forgotten;
- **late creation**: files (and directories) that appear later are picked up by the next scan.

Where reading starts: files that already exist when the tailer first starts (or takes its
``baseline``, just before the first job is spawned) are read from their
*current end* (their content is history, possibly from an earlier run; replaying an old NaN would
be wrong); files that appear afterwards are read from their beginning. Create one tailer per run
and call ``start`` / ``stop`` per attempt: offsets carry over, and ``stop`` drains what the dead
attempt wrote, so nothing is lost or attributed to the wrong attempt.

Bounded memory: a line longer than ``max_line_bytes`` (64 KiB) is cut, its head is delivered with
a ``[line truncated]`` marker and the rest is skipped up to the next newline; binary garbage is
decoded with replacement characters. A file truncated or rotated over and over is said at most
once per file per :data:`~.quiet.REPEAT_AFTER_S` (:mod:`.quiet`). Nothing in here raises into the
caller.

``history_at_start=False`` (the client's metric files in a heartbeat folder made for the attempt):
nothing there is history, so files the first scan finds are read from their beginning too (a job
that reported its first steps before the monitors started lost them otherwise).

``follow_links=False`` (the heartbeat folder, which the job writes): a link in a file's place is
not followed (it may lead out of the folder), and only the regular file that was looked at is
read (a name swapped between the look and the open is not). The heartbeat monitor names those
files one by one (``add_paths``, found by its bounded listing): no glob over a folder the job
can fill with 100,000 files.
"""

from __future__ import annotations

import glob as globlib
import os
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import structlog

from ..events import AttemptContext, Emit, LineSink
from ..job.linesplit import TRUNCATED_MARKER, LineSplitter
from .quiet import QuietLog

log = structlog.get_logger("supervisor.watch")

_GLOB_CHARS = frozenset("*?[")


@dataclass
class _Followed:
    path: str
    fd: int
    ident: tuple[int, int]
    offset: int
    splitter: LineSplitter = field(default_factory=LineSplitter)


def _static_dir(pattern: str) -> tuple[str, bool]:
    """The deepest directory of a glob without wildcards, and whether deeper levels are globbed."""
    parts = Path(pattern).parts
    static: list[str] = []
    for part in parts[:-1]:
        if _GLOB_CHARS & set(part):
            return (os.path.join(*static) if static else "/"), True
        static.append(part)
    return (os.path.join(*static) if static else "."), False


class FileTailer:
    """A :class:`~supervisor.events.Monitor` feeding lines of files matching ``globs`` to ``sink``.

    ``source`` of each batch is ``"file:<path>"``. ``poll`` does nothing (a thread does the work);
    ``status`` lists followed files, globs that match nothing, and whether inotify is active.
    """

    name = "files"

    def __init__(self, globs: Sequence[str], cwd: Path, sink: LineSink, *, poll_interval_s: float = 0.5,
                 max_line_bytes: int = 64 * 1024, read_chunk: int = 1 << 20, use_inotify: bool = True,
                 batch_lines: int = 4096, retire_grace_s: float = 2.0, history_at_start: bool = True,
                 follow_links: bool = True) -> None:
        self.patterns = tuple(g if os.path.isabs(g) else os.path.join(str(cwd), g) for g in globs)
        self.sink = sink
        self.follow_links = follow_links
        self.poll_interval_s = poll_interval_s
        self.max_line_bytes = max_line_bytes
        self.read_chunk = read_chunk
        self.use_inotify = use_inotify
        self.batch_lines = batch_lines
        self.retire_grace_s = retire_grace_s
        # Files renamed away or deleted: still read through the open fd for retire_grace_s, since
        # a writer may finish its last lines into the rotated file after the rename.
        self._retired: list[tuple[float, _Followed]] = []
        self._files: dict[tuple[int, int], _Followed] = {}
        # False: nothing there is history (a folder made for this attempt), so what the first scan
        # finds is read from its beginning like any later file.
        self._first_scan = history_at_start
        self._scan_lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._observer: Any = None
        self._watched: dict[str, Any] = {}
        self._inotify_error: str | None = None
        self._sink_failed = False
        self._scan_failed = False
        self._lines = 0
        self._bytes = 0
        self._truncated_lines = 0
        self._scans = 0
        self._quiet = QuietLog(log)  # a log truncated or rotated every few seconds: said once per window

    # -- Monitor --------------------------------------------------------------------------

    def start(self, ctx: AttemptContext | None = None, emit: Emit | None = None) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stopping.clear()
        if self.use_inotify and self._observer is None:
            self._start_observer()
        if self._first_scan:
            # The baseline ("what exists now is history") is taken here, not in the thread, so
            # a file the job creates right after start() is never mistaken for history.
            self.scan_now()
        self._thread = threading.Thread(target=self._run, name="tsup-tail", daemon=True)
        self._thread.start()

    def add_paths(self, paths: Sequence[str]) -> None:
        """Follow these files too (literal paths: each costs a look, not a listing), and scan soon."""
        if paths:
            # No lock (a scan may hold it for a 16 MiB read): one writer, and a tuple assigned whole
            # is what the tail thread's next scan iterates.
            self.patterns = self.patterns + tuple(p for p in paths if p not in self.patterns)
            self._wake.set()

    def baseline(self) -> None:
        """Take the "what exists now is history" baseline if it is not taken yet. Call it before
        the first attempt's job is spawned: a job that writes its first lines before the monitors
        start (they start after the spawn) must not have them taken for history."""
        if self._first_scan:
            self.scan_now()

    def poll(self, now: float) -> None:
        return None

    def stop(self) -> None:
        """Stop following; the files' remaining lines are read and fed before this returns."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self._observer is not None:
            try:
                self._observer.stop()
                self._observer.join(timeout=5)
            except Exception:  # the observer thread owns its errors
                pass
            self._observer = None
            self._watched.clear()

    def close(self) -> None:
        """Stop and forget every followed file (end of the run)."""
        self.stop()
        with self._scan_lock:
            for f in self._files.values():
                os.close(f.fd)
            self._files.clear()
            for _, f in self._retired:
                os.close(f.fd)
            self._retired.clear()

    def status(self) -> Mapping[str, object]:
        return {
            "globs": list(self.patterns),
            "files": {f.path: f.offset for f in self._files.values()},
            "retired": [f.path for _, f in self._retired],
            "unmatched_globs": [p for p in self.patterns if not globlib.glob(p)],
            "mode": "inotify+poll" if self._observer is not None else "poll",
            "inotify_error": self._inotify_error,
            "lines": self._lines,
            "bytes": self._bytes,
            "truncated_lines": self._truncated_lines,
        }

    # -- the thread -------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            stopping = self._stopping.is_set()
            self._wake.clear()
            more = self.scan_now()
            if stopping:
                if more:
                    continue
                self._retire_all()
                return
            if not more:
                self._wake.wait(self.poll_interval_s)

    def scan_now(self) -> bool:
        """One scan of every glob and followed file; True when a read budget left data unread."""
        try:
            with self._scan_lock:
                self._scans += 1
                if self._observer is not None:
                    self._update_watches()
                return self._scan()
        except Exception as exc:  # a monitor survives its own errors
            if not self._scan_failed:
                self._scan_failed = True
                log.exception("tail_scan_failed", error=repr(exc),
                              next="the tailer keeps scanning; files may be read late")
            return False

    def _scan(self) -> bool:
        current: dict[tuple[int, int], tuple[str, os.stat_result]] = {}
        for pattern in self.patterns:
            for path in globlib.glob(pattern):
                try:
                    st = os.stat(path) if self.follow_links else os.lstat(path)
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode) or os.path.basename(path).startswith("events.out.tfevents."):
                    continue  # a TensorBoard event file is binary: watch/metricfiles.py reads it
                current.setdefault((st.st_dev, st.st_ino), (path, st))
        more = False
        now = time.monotonic()
        for deadline, f in list(self._retired):
            more |= self._read(f)
            if now >= deadline and not more:
                self._close_retired(f)
        for ident, f in list(self._files.items()):
            seen = current.pop(ident, None)
            if seen is None:  # deleted or renamed away: what is left is read from the open fd
                more |= self._read(f)
                del self._files[ident]
                self._retired.append((now + self.retire_grace_s, f))
                self._quiet.say("info", "tail_file_gone", f.path, grace_s=self.retire_grace_s,
                                next="reading what is still written to it for the grace period; "
                                     "following its successor when one appears")
                continue
            path, st = seen
            if path != f.path:
                f.path = path
            if st.st_size < f.offset:
                self._quiet.say("info", "tail_file_truncated", path, offset=f.offset, size=st.st_size,
                                next="reading it again from the start")
                self._flush_partial(f)
                f.offset = 0
            if st.st_size > f.offset:
                more |= self._read(f)
        for ident, (path, st) in current.items():
            flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | (0 if self.follow_links else os.O_NOFOLLOW)
            try:
                fd = os.open(path, flags)
            except OSError:
                continue
            opened = os.fstat(fd)  # of an open descriptor: does not fail
            if (opened.st_dev, opened.st_ino) != ident or not stat.S_ISREG(opened.st_mode):
                os.close(fd)  # swapped since the look (a FIFO, a link's target): not what was judged
                continue
            start = st.st_size if self._first_scan else 0
            f = _Followed(path=path, fd=fd, ident=ident, offset=start, splitter=LineSplitter(self.max_line_bytes))
            self._files[ident] = f
            log.info("tail_file_followed", path=path, offset=start,
                     next="new lines are fed to the detectors")
            more |= self._read(f)
        self._first_scan = False
        return more

    def _close_retired(self, f: _Followed) -> None:
        self._retired = [(d, g) for d, g in self._retired if g is not f]
        while self._read(f):
            pass
        self._flush_partial(f)
        os.close(f.fd)

    def _retire_all(self) -> None:
        with self._scan_lock:
            for _, f in list(self._retired):
                self._close_retired(f)

    def _read(self, f: _Followed, budget: int = 16 << 20) -> bool:
        """Read from ``f.offset`` up to ``budget`` bytes; True when data was left unread."""
        lines: list[str] = []
        got = 0
        while got < budget:
            try:
                data = os.pread(f.fd, self.read_chunk, f.offset)
            except OSError:
                break
            if not data:
                break
            f.offset += len(data)
            got += len(data)
            self._split(f, data, lines)
            if len(lines) >= self.batch_lines:
                self._feed(f.path, lines)
                lines = []
        self._feed(f.path, lines)
        self._bytes += got
        return got >= budget

    def _split(self, f: _Followed, data: bytes, out: list[str]) -> None:
        before = f.splitter.truncated
        out.extend(f.splitter.push(data))
        self._truncated_lines += f.splitter.truncated - before

    def _flush_partial(self, f: _Followed) -> None:
        rest = f.splitter.flush()
        if rest:
            self._feed(f.path, rest)

    def _feed(self, path: str, lines: list[str]) -> None:
        if not lines:
            return
        self._lines += len(lines)
        try:
            self.sink.feed(f"file:{path}", lines)
        except Exception as exc:  # a sink must not raise; if it does, say so once
            if not self._sink_failed:
                self._sink_failed = True
                log.exception("tail_sink_failed", path=path, error=repr(exc),
                              next="lines keep being read and offered to the sink")

    # -- inotify (watchdog) -------------------------------------------------------------------

    def _start_observer(self) -> None:
        try:
            from watchdog.events import FileSystemEventHandler
            from watchdog.observers import Observer
        except ImportError as exc:
            self._inotify_error = f"watchdog unavailable: {exc}"
            log.warning("tail_inotify_unavailable", error=self._inotify_error, next="polling only")
            return
        wake = self._wake

        class _Handler(FileSystemEventHandler):
            def on_any_event(self, event: object) -> None:
                wake.set()

        self._handler = _Handler()
        try:
            obs = Observer()
            obs.daemon = True
            obs.start()
        except Exception as exc:
            self._inotify_error = repr(exc)
            log.warning("tail_inotify_unavailable", error=self._inotify_error, next="polling only")
            return
        self._observer = obs
        self._update_watches()

    def _update_watches(self) -> None:
        """Watch each glob's static directory once it exists (else its nearest existing parent)."""
        for pattern in self.patterns:
            d, recursive = _static_dir(pattern)
            target = d
            while not os.path.isdir(target) and target not in ("/", ""):
                target = os.path.dirname(target)
            key = f"{target}|{recursive and target == d}"
            if key in self._watched:
                continue
            try:
                self._watched[key] = self._observer.schedule(self._handler, target, recursive=recursive and target == d)
            except Exception as exc:  # inotify limits: poll instead
                self._watched[key] = None
                if self._inotify_error is None:
                    self._inotify_error = repr(exc)
                    log.warning("tail_inotify_watch_failed", directory=target, error=repr(exc),
                                next="that directory is polled every %.1f s" % self.poll_interval_s)


__all__ = ["FileTailer", "TRUNCATED_MARKER"]
