"""Whose is a metric file found in the job's tree: the job's, or a file someone else writes there.

The metric-file walk takes every text log (``*.log``, ``*.txt``), ``*.jsonl``, metrics CSV,
TensorBoard event file and MLflow store under the working dir for the job's. A file the job never
wrote (an operator's ``notes.txt``, another tool's ``other_tool.jsonl``, an old run's log copied in,
another process's ``SummaryWriter`` or MLflow run) must not roll back or end a healthy run (issue
34). So a non-finite value read from an AUTO-DISCOVERED file is acted on only when the file showed
it is the job's (files named in config, ``[job] watch_files``, stay trusted):

(a) **Held open by the job**: a process of the job's tree (the attempt's leader and its
    descendants) holds it open, seen in ``/proc/<pid>/fd``. Looked for when such a file yields
    records (at most every ``SCAN_EVERY_S``, backing off to ``SCAN_BACKOFF_MAX_S`` while not
    found) and before its first non-finite value is judged. Once seen, the file (path and
    identity) is the job's for the rest of the run, and its steps are a trusted step source.
    ``logging.FileHandler``, loguru: found at the first look. A TensorBoard event file whose name
    carries this host and the pid of a process of the job's tree (``SummaryWriter`` names it so;
    without TensorFlow it opens and closes the file per flush) counts as held open.
(b) **Its steps track the job's**, when the job's step is known from a trusted source (stdout /
    stderr, the client's metric reports, a file named in config, a file of (a)) during this
    attempt: the file grew in at least ``MIN_WRITES`` separate reads with a finite, stepped record
    (not a whole history written at once: a copied old log), ``MIN_STEPS`` such records, and the
    non-finite record's step (else the file's last) is within the lag window of the job's step:
    at most ``LAG_MAX`` ahead (a stdout that prints every N steps lags the file), at most
    ``max(LAG_MIN, 2 x the file's steps per write, the job's steps in LATENCY_S)`` behind (capped
    at ``LAG_MAX``: Lightning's CSVLogger writes 100 steps a flush).
(c) **No trusted step source at all** (a job that prints nothing per step): the history rule, and
    the file was created in this run (read from its start, not history) and grew in at least
    ``MIN_WRITES`` separate reads, the non-finite value read at least ``SPREAD_S`` seconds after the
    file was found. A file first read after the
    job exited (written whole in its last moment) needs only the history and to be new in the run.
    Residual risk: with no trusted step source, a foreign process that creates a file during the
    run and appends finite steps to it over time before a NaN is trusted (nothing tells it from
    the job's own open-append-close log); naming the job's files in ``[job] watch_files`` and
    printing steps removes it.

A file that fails is not acted on: ``metric_file_untrusted`` (a warning, once per file and attempt)
names it, says why and how to have it trusted (name it in ``[job] watch_files``). Only non-finite
records are held back; the file's other records go to the detectors as before.

Bounded: a look lists the job's tree from one pass over ``/proc`` (a parent link each, psutil's
cost of ``children(recursive=True)``), then reads the fd links of at most ``MAX_PIDS`` processes,
``MAX_FDS`` links in all; at most ``MAX_KNOWN`` files are remembered. Linux only; without ``/proc``
nothing is ever seen held open and rules (b)/(c) decide.
"""

from __future__ import annotations

import fnmatch
import math
import os
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import psutil
import structlog

from ..core.observations import MetricRecord
from .nannotes import NAN_ITERATIONS
from .sources import CLIENT_METRICS_MARKER

log = structlog.get_logger("supervisor.watch")

PROC = "/proc"
MAX_PIDS = 64
MAX_FDS = 4096
SCAN_EVERY_S = 1.0
SCAN_BACKOFF_MAX_S = 30.0
MIN_STEPS = 2
MIN_WRITES = 2
SPREAD_S = 0.5
LAG_MIN = 20
LAG_MAX = 500
LATENCY_S = 0.25
MAX_KNOWN = 4096
TB_PREFIX = "events.out.tfevents."
_FIELDS = ("loss", "grad_norm", "lr", "tokens_per_sec", "val_loss")
#: sources of auto-discovered metric files (:func:`.fileread.source_of`): not a trusted step source
_FILE_SOURCES = ("file:", "tb:", "log:", "mlflow:")


class _Followed(Protocol):
    path: str
    kind: str
    ident: tuple[int, int]
    fresh: bool  # read from its start in this run (created or truncated after the baseline)
    seen: float  # when it was first found (monotonic)


def alarming(rec: MetricRecord) -> bool:
    """Whether ``rec`` holds a value a NaN detector acts on (non-finite, or Megatron's nan count)."""
    for name in _FIELDS:
        v = getattr(rec, name)
        if v is not None and not math.isfinite(v):
            return True
    return rec.extra.get(NAN_ITERATIONS, 0) > 0 or any(not math.isfinite(v) for v in rec.extra.values())


@dataclass
class _Evidence:
    """What one file not yet known as the job's showed (kept across attempts: a log the job
    appended its steps to in one attempt is still its log in the next)."""

    real: str  # its real path, as /proc's fd links name it
    fresh: bool = False  # read from its start in this run (created or truncated after the baseline)
    seen: float = 0.0  # when it was first found (monotonic)
    steps: int = 0  # finite records with a step
    writes: int = 0  # reads that gave at least one finite record with a step
    first_at: float | None = None  # when the first of those was read (monotonic)
    first_step: int | None = None  # its step, and the last finite step read
    last_step: int | None = None
    job_first: int | None = None  # the job's step when the first was read
    looked: bool = False  # looked for in the job's open files this attempt
    warned: bool = False  # said untrusted this attempt


def job_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (at most ``MAX_PIDS``); ``[]`` when ``pid`` is gone."""
    try:
        proc = psutil.Process(pid)
        kids = [c.pid for c in proc.children(recursive=True)]
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return []
    return [pid, *kids][:MAX_PIDS]


def held_open(pids: Sequence[int], paths: set[str], proc: str = PROC) -> set[str]:
    """Those of ``paths`` (real paths) that one of ``pids`` holds open (at most ``MAX_FDS`` links read)."""
    found: set[str] = set()
    budget = MAX_FDS
    for pid in pids:
        if budget <= 0 or found == paths:
            break
        try:
            with os.scandir(f"{proc}/{pid}/fd") as it:
                fds = [e.path for _, e in zip(range(budget), it)]
        except OSError:  # gone, or not ours to read
            continue
        budget -= len(fds)
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target in paths:
                found.add(target)
    return found


class BookSteps:
    """The steps the sink's source book (the log watcher's ``sources``: looked up at each call, a
    sink attached later counts) noted per source since :meth:`mark` (the attempt's start)."""

    def __init__(self, sink: object) -> None:
        self.sink = sink
        self.since = 0.0

    def _book(self) -> Any:
        return getattr(self.sink, "sources", None)

    def mark(self) -> None:
        book = self._book()
        if book is not None:
            self.since = book.clock()

    def __call__(self) -> list[tuple[str, int]]:
        book = self._book()
        if book is None:
            return []
        return [(s.source, s.last_step) for s in book.states() if s.last_step is not None and s.at >= self.since]


class _Steps(Protocol):
    def mark(self) -> None: ...
    def __call__(self) -> list[tuple[str, int]]: ...


class _NoSteps:
    def mark(self) -> None:
        return None

    def __call__(self) -> list[tuple[str, int]]:
        return []


class Writers:
    """Judges the records of auto-discovered metric files (``admit``) for
    :class:`~.metricfiles.MetricFiles`; its reader thread alone calls ``admit``, the loop calls ``attempt``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, proc: str = PROC,
                 tree: Callable[[int], list[int]] = job_tree, job_steps: _Steps | None = None,
                 named: Sequence[str] = ()) -> None:
        self.clock, self.proc, self.tree = clock, proc, tree
        self.job_steps: _Steps = job_steps or _NoSteps()  # each source's step this attempt
        self.named = tuple(named)  # [job] watch_files patterns: trusted
        self._pid: int | None = None
        self._held_step: int | None = None  # the last step of a file the job holds open (this attempt)
        self._trusted: dict[tuple[str, tuple[int, int]], bool] = {}  # (path, (dev, ino)): the job's; held open
        self._evidence: dict[tuple[str, tuple[int, int]], _Evidence] = {}
        self._next_scan = 0.0
        self._gap = SCAN_EVERY_S
        self.scans = 0
        self.withheld = 0
        self.withheld_files: dict[str, int | None] = {}  # path: the step of its first value set aside

    def attempt(self, pid: int | None) -> None:
        """A new attempt's job (None: no job known, every record is admitted as before)."""
        for ev in self._evidence.values():
            ev.looked = ev.warned = False
        self._next_scan, self._gap, self._pid = 0.0, SCAN_EVERY_S, pid
        self._held_step = None
        self.job_steps.mark()

    def admit(self, f: _Followed, records: list[MetricRecord], final: bool = False) -> list[MetricRecord]:
        """``records`` read from ``f`` less the non-finite ones the job is not known to have
        written (``final``: the job is gone)."""
        key = (f.path, f.ident)
        if self._pid is None or self._named(f.path):
            return records
        if key in self._trusted:
            self._note_held(key, records)
            return records
        ev = self._evidence.get(key)
        if ev is None:
            ev = self._evidence[key] = _Evidence(os.path.realpath(f.path), f.fresh, f.seen)
            _bound(self._evidence)
        if f.kind == "tb" and not ev.looked and self._tb_writer(f.path):
            self._trust(key, held=True)  # its name says a process of the job's tree wrote it
        due = self.clock() >= self._next_scan or (not ev.looked and any(map(alarming, records)))
        if key in self._trusted or (due and self._look(key)):
            self._note_held(key, records)
            return records
        out: list[MetricRecord] = []
        wrote = False
        for rec in records:
            if not alarming(rec):
                if rec.step is not None:
                    ev.steps += 1
                    ev.last_step = rec.step
                    if ev.first_step is None:
                        ev.first_step = rec.step
                    wrote = True
                out.append(rec)
                continue
            why = self._judge(ev, rec, final)
            if why is None:
                self._trust(key)
                out.append(rec)  # the job's: the NaN is acted on
            else:
                self.withheld += 1
                if f.path not in self.withheld_files:  # the end says it (core/runend.withheld_text)
                    self.withheld_files[f.path] = rec.step
                    _bound(self.withheld_files)
                if not ev.warned:
                    ev.warned = True
                    self._warn(f.path, rec, why)
        if wrote:
            ev.writes += 1
            if ev.first_at is None:
                ev.first_at, ev.job_first = self.clock(), self._job_step()
        return out

    def _judge(self, ev: _Evidence, rec: MetricRecord, final: bool) -> str | None:
        """None when ``rec`` (non-finite) of the file with evidence ``ev`` is the job's; else why not."""
        if ev.steps < MIN_STEPS:
            return f"it logged {ev.steps} step(s) before the non-finite value ({MIN_STEPS} needed)"
        job = self._job_step()
        if job is None and final and ev.fresh:
            return None  # written whole in the job's last moment, and no step of the job to compare
        if ev.writes < MIN_WRITES:
            return (f"its {ev.steps} record(s) before the non-finite value were written at once, not as the job "
                    "ran (a copied log)")
        if job is None:
            if not ev.fresh:
                return "it existed before the run, and the job's step is not known from its output to compare"
            if self.clock() - ev.seen < SPREAD_S:
                return f"it was found under {SPREAD_S} s before the non-finite value"
            return None
        step = rec.step if rec.step is not None else ev.last_step
        assert step is not None and ev.first_step is not None and ev.last_step is not None
        per_write = (ev.last_step - ev.first_step) / max(1, ev.writes - 1)
        rate = 0.0  # the job's steps a second while the file grew: what a read's latency may lag
        if ev.job_first is not None and ev.first_at is not None:
            rate = max(0.0, job - ev.job_first) / max(self.clock() - ev.first_at, 1e-3)
        behind = min(LAG_MAX, max(LAG_MIN, 2 * per_write, rate * LATENCY_S))
        if not -LAG_MAX <= job - step <= behind:
            return (f"its step {step} does not track the job's step {job} (from its output; at most {int(behind)} "
                    f"behind or {LAG_MAX} ahead)")
        return None

    def _job_step(self) -> int | None:
        """The job's step this attempt from a trusted source (its output, a file it holds open)."""
        got = [step for source, step in self.job_steps() if self._trusted_source(source)]
        if self._held_step is not None:
            got.append(self._held_step)
        return max(got) if got else None

    def _trusted_source(self, source: str) -> bool:
        """The job's output, the client's reports, a file named in config (not one found by the walk)."""
        if CLIENT_METRICS_MARKER in source or not source.startswith(_FILE_SOURCES):
            return True
        return source.startswith("file:") and self._named(source[len("file:"):])

    def _named(self, path: str) -> bool:
        return any(fnmatch.fnmatch(path, g) for g in self.named)

    def _note_held(self, key: tuple[str, tuple[int, int]], records: list[MetricRecord]) -> None:
        if self._trusted.get(key):
            for rec in records:
                if rec.step is not None:
                    self._held_step = rec.step if self._held_step is None else max(self._held_step, rec.step)

    def _trust(self, key: tuple[str, tuple[int, int]], held: bool = False) -> None:
        self._evidence.pop(key, None)
        self._trusted[key] = held
        _bound(self._trusted)

    def _tb_writer(self, path: str) -> bool:
        """Whether a TensorBoard event file's name (``events.out.tfevents.<time>.<host>.<pid>.<n>``)
        names this host and a process of the job's tree: TensorBoard without TensorFlow opens,
        appends and closes the file per flush, so it is seldom seen held open."""
        assert self._pid is not None
        rest = os.path.basename(path)[len(TB_PREFIX):].partition(".")[2]
        host = socket.gethostname()
        if not rest.startswith(host + "."):
            return False
        pid = rest[len(host) + 1:].partition(".")[0]
        return pid.isdigit() and int(pid) in self.tree(self._pid)

    def _look(self, key: tuple[str, tuple[int, int]]) -> bool:
        """Look for the files not yet known as the job's in its open files; whether ``key`` was found."""
        assert self._pid is not None
        self.scans += 1
        found = held_open(self.tree(self._pid), {ev.real for ev in self._evidence.values()}, self.proc)
        for k, ev in list(self._evidence.items()):
            ev.looked = True
            if ev.real in found:
                self._trust(k, held=True)
        if key in self._trusted:
            return True
        self._next_scan = self.clock() + self._gap
        self._gap = min(SCAN_BACKOFF_MAX_S, self._gap * 2)
        return False

    def _warn(self, path: str, rec: MetricRecord, why: str) -> None:
        log.warning("metric_file_untrusted", path=path, step=rec.step,
                    why=f"no process of the job was seen holding it open, and {why}: it may be a file "
                        "the job never wrote",
                    next="the run goes on; a non-finite value in this file is acted on once the job is seen "
                         "writing it (holding it open, or its steps tracking the job's as it runs). If the job "
                         "writes it, name it in [job] watch_files: it is then trusted and its NaNs are acted on")


def _bound(table: dict[Any, Any]) -> None:
    """At most ``MAX_KNOWN`` files remembered: the oldest is forgotten (a job that makes a new log
    every step must not grow the table for the life of the daemon)."""
    while len(table) > MAX_KNOWN:
        del table[next(iter(table))]


__all__ = ["LAG_MAX", "LAG_MIN", "MIN_STEPS", "MIN_WRITES", "SPREAD_S", "BookSteps", "Writers", "alarming",
           "held_open", "job_tree"]
