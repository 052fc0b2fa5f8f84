"""Where the metrics come from: per source (``stdout``, ``stderr``, ``file:<path>``, ``tb:<path>``,
the client's metric files), the formats it yielded, how many records, its last step and when.

``status`` shows it (``metric_sources``), so a user sees which of the job's outputs the
supervisor actually understands, and which one is stale. The log watcher calls :meth:`SourceBook.note`
under its own lock, for lines it parsed (``feed``) and for records read from metric files
(``feed_records``) alike; :meth:`SourceBook.snapshot` may be called from any thread.

It is the one list of the metric sources seen: the end of a run says from it what was watched
(supervisor.core.runend: "finished, unwatched" when no source yielded a record), and how many
lines of each started like a metric record but gave none (``unread``, :mod:`.unparsed`). A new
kind of source is seen there by feeding its records to the log watcher, nothing else.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable

#: A job that writes a metric file per rank and per run (``version_N/metrics.csv``) must not grow
#: the book without bound: past this many sources the one updated longest ago is dropped.
MAX_SOURCES = 32
#: In a source's name: the client's metric reports (``metrics-rank<R>.jsonl``, :mod:`.heartbeat`).
CLIENT_METRICS_MARKER = "/metrics-rank"


def origin_of(source: str, from_file: bool) -> str:
    """Where a step was seen, for people: ``output (stdout)``, ``metric file /x/events...``."""
    path = source.partition(":")[2] if source.startswith(("file:", "tb:")) else source
    if CLIENT_METRICS_MARKER in source:
        return f"client metrics {path}"
    if from_file:
        return f"metric file {path}"
    return f"output ({source})" if source in ("stdout", "stderr") else f"log file {path}"


@dataclass(frozen=True)
class SourceState:
    """What one source has yielded so far (``at``: the monotonic time of its last record)."""

    source: str
    formats: tuple[str, ...]
    records: int
    last_step: int | None
    at: float
    unread: int = 0  # lines that start like a metric record but gave none (:mod:`.unparsed`)

    def to_json(self, now: float) -> dict[str, Any]:
        """The ``status --json`` shape: ``{"source", "formats", "records", "unread", "last_step", "age_s"}``."""
        return {"source": self.source, "formats": list(self.formats), "records": self.records,
                "unread": self.unread, "last_step": self.last_step, "age_s": round(max(0.0, now - self.at), 3)}


@dataclass
class SourceBook:
    """The per-source bookkeeping; thread-safe."""

    clock: Callable[[], float]
    max_sources: int = MAX_SOURCES
    _states: dict[str, SourceState] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, source: str, fmt: str, step: int | None, now: float | None = None) -> SourceState:
        """One record of ``fmt`` from ``source`` (``step`` None: a record that names no step, which
        keeps the source's last step)."""
        now = self.clock() if now is None else now
        with self._lock:
            old = self._states.get(source)
            if old is None:
                self._make_room()
                new = SourceState(source, (fmt,), 1, step, now)
            else:
                fmts = old.formats if fmt in old.formats else (*old.formats, fmt)
                new = SourceState(source, fmts, old.records + 1, step if step is not None else old.last_step, now,
                                  old.unread)
            self._states[source] = new
            return new

    def note_unread(self, source: str, now: float | None = None) -> SourceState:
        """One line of ``source`` that starts like a metric record but gave none. A source with
        unread lines only is listed with 0 records: seen, not watched."""
        now = self.clock() if now is None else now
        with self._lock:
            old = self._states.get(source)
            if old is None:
                self._make_room()
                new = SourceState(source, (), 0, None, now, 1)
            else:
                new = SourceState(source, old.formats, old.records, old.last_step, old.at, old.unread + 1)
            self._states[source] = new
            return new

    def _make_room(self) -> None:
        if len(self._states) >= self.max_sources:
            stalest = min(self._states.values(), key=lambda s: s.at)
            del self._states[stalest.source]

    def states(self) -> list[SourceState]:
        """Every source, the most recently updated first."""
        with self._lock:
            return sorted(self._states.values(), key=lambda s: -s.at)

    def snapshot(self, now: float | None = None) -> list[dict[str, Any]]:
        now = self.clock() if now is None else now
        return [s.to_json(now) for s in self.states()]

    def __len__(self) -> int:
        return len(self._states)
