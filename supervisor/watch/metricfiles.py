"""Metric files the job writes, found and followed with no config (a :class:`~supervisor.events.Monitor`).

Many trainers print nothing per step into a pipe (Lightning with the Rich bar) but write their
metrics to files: TensorBoard event files (Lightning's default logger, HF
``report_to="tensorboard"``, ``torch.utils.tensorboard``), CSV (``lightning_logs/version_N/
metrics.csv``), JSONL. This monitor scans the job's working directory and the roots added later
(:meth:`MetricFiles.add_root`: the checkpoint or output dir once known) about once a second and
hands what they grow to a :class:`RecordSink` (the log watcher's ``feed_records``), with sources
``tb:<path>`` and ``file:<path>``. A write to a file already followed wakes the reader at once
(:mod:`.dirwake`: inotify on the directories of followed files), so a NaN is judged within
milliseconds, also when the job exits right after it.

What is read:

- ``events.out.tfevents.*``: :mod:`.tbevents` (scalars keep their step).
- ``metrics.csv`` / ``*metrics*.csv`` whose header names a loss-like column. Lightning's
  ``CSVLogger`` rewrites the whole file when a new column appears (``val_loss`` after the first
  validation): a changed header means "the same rows again, then new ones", so the rows already
  consumed are skipped by count and no step is delivered twice.
- ``*.jsonl`` whose lines are JSON objects with a loss-like key; a file whose first
  ``JSONL_PROBE_LINES`` lines have none is not a metrics file and is dropped.

No file is dropped for good: a dropped file (a CSV header with no loss column, a JSONL with no
metric line) is looked at again when its size or mtime changes (:mod:`.fileread`). Links to files
out of the roots are not followed (``metric_file_link_refused``, once per link): what drives a
stop or a rollback is the job's own tree, as for checkpoint discovery.

Files that exist at the baseline (taken before the run's first launch) are history: read from
their end (an old NaN must not be replayed). Files first seen later are read from their start,
unless their mtime is older than the baseline (a slow scan's late find of an old file). A file
found by the walk is the job's only when it shows it (:mod:`.writers`): a NaN in a file someone
else writes into the tree (``notes.txt``, a copied old log) is ``metric_file_untrusted``.

Bounded cost: the walk is limited to ``depth`` levels below each root, ``max_dirs`` directories,
``MAX_ENTRIES`` directory entries and ``MAX_FILES`` files per pass (logged once when capped), and
skips ``.git``, hidden directories, virtual environments (a ``pyvenv.cfg`` inside), ``site-packages``,
``node_modules``, ``__pycache__``, ``quarantine`` and the paths in ``exclude`` (the state dir, whose client metric
files the heartbeat monitor already reads). Per file: ``READ_BUDGET`` bytes a pass, an unfinished
line of at most ``MAX_RECORD_LINE`` bytes, one TensorBoard record, a bounded resync CRC rate
(:mod:`.readbounds`, :mod:`.tbevents`). A file that fails to parse is reported, rate-limited
(:mod:`.quiet`); nothing raises into the caller.
"""

from __future__ import annotations

import glob as globlib
import itertools
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Mapping, Protocol, Sequence
import structlog

from ..events import AttemptContext, Emit
from ..core.observations import MetricRecord
from .dirwake import DirWake
from .candidates import file_id, own_output
from .consolecopies import ConsoleCopies
from .fileread import FileReader, source_of
from .mlflowstore import MlflowDb, is_db, is_file_store_metric
from .parsers import MetricParser
from .filerows import JSONL_PROBE_LINES, FileState
from .quiet import FirstFew, QuietLog
from .readbounds import READ_CHUNK, inside
from .tbevents import TBReader
from .writers import BookSteps, Writers

log = structlog.get_logger("supervisor.watch")

#: Text logs a job writes beside (or instead of) its output: read with the line parsers.
LOG_SUFFIXES = (".log", ".txt")
#: MLflow's file store keeps a key's values 3 levels below the run's folder (mlruns/<exp>/<run>/
#: metrics/<key>, and a key with "/" one level per part): so many levels more inside an mlruns tree.
MLRUNS_EXTRA_DEPTH = 4
SKIP_DIRS = frozenset({"site-packages", "node_modules", "__pycache__", "quarantine", "dist-packages"})
#: after the job's exit, how long its metric files may still be read before its end is judged
EXIT_CATCH_UP_S = 30.0
READ_BUDGET = READ_CHUNK  # bytes per file per pass: a huge backlog is read over several passes
#: Files followed at most, and directory entries looked at per walk: a job that writes 100,000
#: files costs a bounded walk (a stat each) and bounded state, not one per file each second.
MAX_FILES = 1000
MAX_ENTRIES = 50_000


class RecordSink(Protocol):
    def feed_records(self, source: str, records: Sequence[MetricRecord]) -> None: ...


def kind_of(name: str, path: str = "") -> str | None:
    """``tb``, ``csv``, ``jsonl``, ``log`` (a text log: ``*.log``, ``*.txt``), ``mlflow_db`` (MLflow's
    SQLite store), ``mlflow`` (a metric file of MLflow's file store, judged by ``path``) or None."""
    if name.startswith("events.out.tfevents."):
        return "tb"
    if name.endswith(".csv") and "metrics" in name:
        return "csv"
    if name.endswith(".jsonl"):
        return "jsonl"
    if is_db(name):
        return "mlflow_db"
    if path and is_file_store_metric(path):
        return "mlflow"
    if name.endswith(LOG_SUFFIXES):
        return "log"
    return None


class MetricFiles:
    """Follows metric files under ``roots`` and feeds their records to ``sink``."""

    name = "metric_files"

    def __init__(self, roots: Sequence[Path], sink: RecordSink, *, depth: int = 4, max_dirs: int = 2000,
                 poll_interval_s: float = 1.0, globs: Sequence[str] = (), exclude: Sequence[Path] = (),
                 own_files: Sequence[Path] = (), parser: MetricParser | None = None,
                 use_inotify: bool = True, max_files: int = MAX_FILES, max_entries: int = MAX_ENTRIES) -> None:
        self.sink = sink
        self.depth = depth
        self.max_dirs = max_dirs
        self.max_files = max_files
        self.max_entries = max_entries
        self.poll_interval_s = poll_interval_s
        self.globs = tuple(globs)  # explicit [job] watch_files patterns: their event files are read here
        self.exclude = {os.path.realpath(p) for p in exclude}
        self._roots: list[str] = []
        self._files: dict[str, FileState] = {}
        self._baseline_wall: float | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._walk_due = True  # the next pass searches the tree (else: reads the files followed)
        self._dirwake = DirWake(self._wake) if use_inotify else None
        self._capped_logged = self._scan_failed = self._sink_failed = False
        self.scans = 0
        self.capped = False
        self._reader = FileReader(QuietLog(log), parser, getattr(sink, "note_unread", None))  # lines said unread
        self.writers = Writers(job_steps=BookSteps(sink), named=self.globs)  # a NaN in a file not the job's: not acted on
        self._followed = FirstFew("metric_file_followed", log, "its metrics go to the detectors as the job writes them")
        # The supervisor's own output (the job's log copy where [job] log_file puts it, the daemon's
        # stdout/stderr redirected into the tree): never read back as the job's metrics.
        self.own_files = tuple(own_files)
        self._console = ConsoleCopies()  # `wrap ... | tee train.log`: the copy of our console is ours too
        self._links_out: set[str] = set()  # links out of the tree seen by the last walk (said once each)
        self._mute = False  # a pass that reads without delivering (baseline of a later attempt)
        # The job is gone (its exit, or a later attempt's baseline): a last line without a newline
        # is a whole line (while it runs, a partial line is one being written).
        self._final = False
        # The exit's catch-up (catching_up): when it began (monotonic), the request the loop made
        # (a count) and the last one a whole pass of the reader thread, begun after it, ended with
        # nothing left unread; whether running out of time was said.
        self._exit_at: float | None = None
        self._exit_asked = self._exit_done = 0
        self._catch_up_said = False
        for r in roots:
            self.add_root(r)

    # -- roots --------------------------------------------------------------------------------

    def add_root(self, path: Path | str) -> None:
        """Follow metric files under ``path`` too (an output or checkpoint dir found later)."""
        p = os.path.realpath(str(path))
        if any(p == r or p.startswith(r + os.sep) for r in self._roots):
            return  # already under a root
        self._roots = [r for r in self._roots if not r.startswith(p + os.sep)] + [p]
        self._walk_due = True
        if self.scans:
            log.info("metric_files_root_added", path=p, next="its metric files are followed from the next pass; "
                     "those older than the run are history")
        self._wake.set()

    @property
    def roots(self) -> tuple[str, ...]:
        return tuple(self._roots)

    # -- Monitor ------------------------------------------------------------------------------

    def baseline(self) -> None:
        """Call before each attempt's job is spawned. The first time: what exists now is history.
        Later: what the files hold now belongs to the attempt that ended (a job stopped after a
        NaN goes on logging until it exits): read to the end without delivering, so none of it
        is judged as the next attempt's."""
        if self._baseline_wall is None:
            self._baseline_wall = time.time()
            self.scan_now()
            return
        self._mute = self._final = True  # the ended attempt's job is gone: its last partial lines too
        try:
            while self.scan_now():
                pass
        finally:
            self._mute = False
            self._reader.attempt += 1  # each file's stamp is this pass's: a change from here on is the new job's

    def start(self, ctx: AttemptContext | None = None, emit: Emit | None = None) -> None:
        self.writers.attempt(ctx.pid if ctx is not None else None)
        if self._thread is not None and self._thread.is_alive():
            return
        if self._baseline_wall is None:
            self.baseline()  # only the first: a later one reads without delivering (what the new job wrote!)
        self._stopping.clear()
        self._final, self._exit_at = False, None
        if self._dirwake is not None:
            self._dirwake.start()
        self._thread = threading.Thread(target=self._run, name="tsup-metricfiles", daemon=True)
        self._thread.start()

    def poll(self, now: float) -> None:
        return None

    def catching_up(self) -> bool:
        """After the job's exit (asked before the exit is final): whether what the files held then
        is still being read: a burst written before the exit (a NaN in its last record, a last line
        without a newline) is the attempt's. At most :data:`EXIT_CATCH_UP_S` (a straggler writing
        on), then said. False means every followed file was read and its records fed (their
        detections queued for the loop) up to its size at the exit, or the time ran out."""
        if self._thread is None or not self._thread.is_alive():
            return False
        now = time.monotonic()
        if self._exit_at is None:
            self._exit_at, self._final = now, True
            # One whole pass here, on the caller's thread, under the lock: a pass of the reader
            # thread under way ends first (what it read is fed, its detections queued), then every
            # file (one first written in the job's last second too) is read to its end now.
            # Nothing read before the lock is trusted (an offset moves before its records are fed).
            if not self.scan_now():
                return False
            # A read budget left data: the reader thread goes on; a whole pass of it that begins
            # after this request and leaves nothing unread ends the wait.
            self._exit_asked += 1
            self._walk_due = True
            self._wake.set()
            return True
        if self._exit_done >= self._exit_asked:
            return False
        if now - self._exit_at < EXIT_CATCH_UP_S:
            return True
        if not self._catch_up_said:
            self._catch_up_said = True
            log.warning("metric_files_not_caught_up", waited_s=EXIT_CATCH_UP_S,
                        next="the attempt's end is judged with the records read so far; the rest is still "
                             "read and judged as it comes, until the monitors stop")
        return False

    def stop(self) -> None:
        """Stop following; what the files hold now is read and fed before this returns."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self._dirwake is not None:
            self._dirwake.stop()

    def close(self) -> None:
        self.stop()

    def status(self) -> Mapping[str, object]:
        files = {f.path: {"kind": f.kind, "records": f.records, "last_step": f.last_step}
                 for f in list(self._files.values()) if f.dropped is None and (f.records or f.kind != "jsonl")}
        return {"roots": list(self._roots), "files": files, "scans": self.scans, "capped": self.capped}

    # -- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        next_walk = 0.0
        read_cost = 0.0  # what the last pass over the followed files (no walk) took
        while True:
            stopping = self._stopping.is_set()
            self._wake.clear()
            now = time.monotonic()
            asked = self._exit_asked  # read before the pass: a request made later needs another
            walk = stopping or self._walk_due or now >= next_walk
            if walk:
                next_walk = now + self.poll_interval_s
            more = self.scan_now(walk)
            if walk and not more:
                self._exit_done = asked  # a whole search, every file read to its end and fed
            if not walk:
                read_cost = time.monotonic() - now
            if stopping:
                if more:
                    continue
                return
            if not more and self._wake.wait(max(0.0, next_walk - time.monotonic())):
                # A write wakes us: 10 ms later one read takes the whole burst. A job writing
                # without pause beside many followed files (a stat each) gets passes at most ~10%
                # of the time: the pause grows with what the last pass cost.
                self._stopping.wait(max(0.01, 9 * read_cost))

    def scan_now(self, walk: bool = True) -> bool:
        """One pass: search the tree (``walk``, else only the files followed) and read what the files
        grew. True when a read budget left data unread."""
        try:
            with self._lock:
                if not walk:
                    return self._read_followed()
                self.scans += 1
                self._walk_due = False
                return self._pass()
        except Exception as exc:  # a monitor survives its own errors
            if not self._scan_failed:
                self._scan_failed = True
                log.exception("metric_files_scan_failed", error=repr(exc),
                              next="scanning goes on every %.1f s; metrics from files may be missed"
                              % self.poll_interval_s)
            return False

    def _pass(self) -> bool:
        found = self._walk()
        first = self.scans == 1
        more = False
        new: list[tuple[str, dict[str, str]]] = []  # followed from their start: said, a few by name
        for path, (kind, st) in found.items():
            ident = (st.st_dev, st.st_ino)
            f = self._files.get(path)
            if f is not None and f.ident != ident:  # replaced under the same name: a new file
                f = None
            if f is None:
                history = first or (self._baseline_wall is not None and st.st_mtime < self._baseline_wall - 1.0)
                f = FileState(path, kind, ident, st.st_size if history else 0, tb=TBReader() if kind == "tb" else None,
                              db=MlflowDb(path) if kind == "mlflow_db" else None, fresh=not history, attempt=self._reader.attempt)
                self._files[path] = f
                if self._dirwake is not None:
                    self._dirwake.watch(os.path.dirname(path))
                if history:
                    self._reader.take_history(f, st)
                else:
                    new.append((path, {"kind": kind}))
            elif self._reader.changed_since_dropped(f, st):
                self._reader.reexamine(f, st)
            if f.dropped is None:
                more |= self._read(f, st)
        self._followed.say(new)
        for path in [p for p in self._files if p not in found]:
            del self._files[path]  # deleted: forget it (a new file of the name is read from its start)
        return more

    def _read_followed(self) -> bool:
        more = False
        for f in list(self._files.values()):
            try:
                st = os.stat(f.path)
            except OSError:
                continue
            if f.dropped is None and (st.st_dev, st.st_ino) == f.ident:
                more |= self._read(f, st)
        return more

    def _walk(self) -> dict[str, tuple[str, os.stat_result]]:
        found: dict[str, tuple[str, os.stat_result]] = {}
        links_out: set[str] = set()
        dirs = seen = 0
        capped = ""
        # Breadth first: with the cap, the shallow dirs where loggers write (lightning_logs/,
        # runs/, out/) are searched before the depths of a dataset tree.
        queue: deque[tuple[str, int]] = deque((r, 0) for r in self._roots)
        own = own_output(None, self.own_files)
        tailed = {p for pattern in self.globs for p in globlib.glob(pattern)}  # the line tailer's
        while queue:
            d, level = queue.popleft()
            if dirs >= self.max_dirs:
                capped = f"{self.max_dirs} directories"
                break
            dirs += 1
            if level > 0 and os.path.lexists(os.path.join(d, "pyvenv.cfg")):
                continue  # a virtual environment
            try:
                with os.scandir(d) as it:
                    # A folder of 100,000 files is looked at up to the entry budget, not listed whole.
                    entries = list(itertools.islice(it, max(0, self.max_entries - seen)))
            except OSError:
                continue
            seen += len(entries)
            if seen >= self.max_entries:
                capped = f"{self.max_entries} directory entries"
                queue.clear()
            for e in entries:
                if len(found) >= self.max_files:
                    capped = f"{self.max_files} metric files"
                    queue.clear()
                    break
                name = e.name
                try:
                    if e.is_dir(follow_symlinks=False):
                        depth = self.depth + MLRUNS_EXTRA_DEPTH if _in_mlruns(d, name) else self.depth
                        if (level < depth and not name.startswith(".") and name not in SKIP_DIRS
                                and e.path not in self.exclude):
                            queue.append((e.path, level + 1))
                        continue
                    kind = kind_of(name, e.path)
                    if kind is None or not e.is_file():
                        continue
                    if kind == "log" and e.path in tailed:
                        continue  # named in [job] watch_files: the tailer reads its lines
                    if e.is_symlink() and not inside(e.path, self._roots):
                        links_out.add(e.path)  # the job's tree only: a link out drives no detection
                        continue
                    st = e.stat()
                    if file_id(st) in own or (e.path not in self._files
                                              and self._console.holds(file_id(st), st.st_mtime)):
                        continue
                    found[e.path] = (kind, st)
                except OSError:
                    continue
        for path in sorted(links_out - self._links_out):
            log.warning("metric_file_link_refused", path=path, target=os.path.realpath(path),
                        next="not read: a link out of the job's directories; name the file in [job] "
                             "watch_files to read it")
        self._links_out = links_out
        for pattern in self.globs:
            for path in globlib.glob(pattern):
                if kind_of(os.path.basename(path)) == "tb" and path not in found:
                    try:
                        found[path] = ("tb", os.stat(path))
                    except OSError:
                        pass
        self.capped = bool(capped)
        if capped and not self._capped_logged:
            self._capped_logged = True
            log.warning("metric_files_scan_capped", cap=capped, max_dirs=self.max_dirs, roots=self._roots,
                        next="what is past the cap is not searched; raise [detectors] metric_files_max_dirs, "
                             "or name the files in [job] watch_files")
        return found

    # -- reading ------------------------------------------------------------------------------

    def _read(self, f: FileState, st: os.stat_result) -> bool:
        records, more = self._reader.read(f, st, self._final)
        if records and not self._mute:
            records = self.writers.admit(f, records, self._final)
            f.records += len(records)
            steps = [r.step for r in records if r.step is not None]
            if steps:
                f.last_step = steps[-1]
            try:
                self.sink.feed_records(source_of(f), records)
            except Exception as exc:
                if not self._sink_failed:
                    self._sink_failed = True
                    log.exception("metric_files_sink_failed", error=repr(exc), next="records keep being read")
        return more


def _in_mlruns(parent: str, name: str) -> bool:
    return name == "mlruns" or f"{os.sep}mlruns{os.sep}" in parent + os.sep


__all__ = ["JSONL_PROBE_LINES", "MetricFiles", "RecordSink", "kind_of"]
