"""What the live page shows, as one JSON document (``GET /live.json``, ``ops/livepage.py``).

- the run: the same answer the control socket's ``status`` gives (``daemon/status.py``'s cache:
  state, attempt, restarts by cause, goodput with the time lost by cause, the last metric);
- the loss curve: the ledger's metric rows, read by rowid since the last poll (never the whole
  series again), kept at most ``MAX_POINTS`` points by halving (every other point dropped, the
  stride doubled: an even sample of the whole run), plus each attempt's last point; the restart
  markers from ``report/data.py``'s ``restart_markers`` (the report's own);
- the newest ``EVENTS`` events of the ledger;
- the checkpoints' readiness: the report's table (``report/collect.py``: the quicklist without
  load tests, with the daemon's verdicts read back), refreshed every ``CHECKPOINTS_EVERY_S`` on a
  thread of its own while the page is being read (a cold table of large checkpoints may take
  seconds; no poll waits for it).

The document is built at most every ``REFRESH_S`` whatever the number of pages polling it, passes
the one redaction gate (``redact.redact_data``, as control replies do) and is cut to at most
``MAX_BYTES``. Nothing here writes: the ledger is opened read-only.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import structlog

from .. import strictjson
from ..redact import redact_data

log = structlog.get_logger("supervisor.ops")

REFRESH_S = 0.25  # a page polls every second: a restart is shown within about 1.3 s
MAX_POINTS = 1000  # loss-curve points sent (an SVG of 1000 points draws in a millisecond)
EVENTS = 25  # events shown, newest first
MESSAGE_CHARS = 300  # of each event's message
MARKERS = 200  # restart markers sent, the newest
CHECKPOINT_ROWS = 20  # checkpoints shown, newest first
CHECKPOINTS_EVERY_S = 10.0
MAX_BYTES = 1 << 20  # the document; past it the heavy parts are cut (``_bounded``)


class Curve:
    """An even sample of the run's loss series, at most ``MAX_POINTS`` points, plus each
    attempt's last point (where a restart marker's "steps redone" is measured from)."""

    def __init__(self, max_points: int = MAX_POINTS) -> None:
        self.max_points = max_points
        self.points: list[tuple[float, int, float, int]] = []
        self.stride = 1
        self.seen = 0
        self.last_of: dict[int, tuple[float, int, float, int]] = {}

    def add(self, at: float, step: int, loss: float, attempt: int) -> None:
        p = (at, step, loss, attempt)
        last = self.last_of.get(attempt)
        if last is None or step >= last[1]:
            self.last_of[attempt] = p
        if self.seen % self.stride == 0:
            self.points.append(p)
            if len(self.points) > self.max_points:
                self.points = self.points[::2]
                self.stride *= 2
        self.seen += 1

    def series(self) -> list[tuple[float, int, float, int]]:
        """The sample and the attempts' last points, in time order (the newest point is always in)."""
        kept = set(self.points)
        lasts = sorted(list(self.last_of.values())[-MARKERS:])
        return sorted([*self.points, *(p for p in lasts if p not in kept)])


class LiveData:
    """The page's document, built on the connection threads (one at a time, cached)."""

    def __init__(self, status: Callable[[], Mapping[str, Any]], state_dir: Path,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.status = status  # the control socket's status answer (any thread)
        self.state_dir = state_dir
        self.clock = clock
        self._lock = threading.Lock()
        self._cached = b""
        self._built_at = float("-inf")
        self._led: Any = None  # a read-only Ledger, open during a build
        self._run_id: str | None = None
        self._rowid = 0
        self._curve = Curve()
        self._ckpt: dict[str, Any] = {"rows": [], "as_of": None, "error": None}
        self._ckpt_started_at = float("-inf")
        self._ckpt_running = False
        self._closed = False

    # -- the document ------------------------------------------------------------------------------
    def payload(self) -> bytes:
        with self._lock:
            now = self.clock()
            if now - self._built_at >= REFRESH_S or not self._cached:
                self._cached = self._build()
                self._built_at = now
            return self._cached

    def _build(self) -> bytes:
        try:
            st = dict(self.status())
        except Exception as e:  # the page says so and keeps polling; the run is not concerned
            st = {"state": "unknown", "message": f"the status could not be read: {e}"}
        doc: dict[str, Any] = {"served_at": time.time(), "status": st}
        run_id = st.get("run_id")
        if run_id:
            try:
                doc.update(self._from_ledger(str(run_id)))
            except Exception as e:  # a locked or damaged ledger: the status still shows
                doc["ledger_error"] = f"the ledger could not be read: {e}"
            finally:
                # Opened for each build: each runs on whichever connection thread asked, and an
                # SQLite connection belongs to the thread that made it (a millisecond to open).
                self._close_ledger()
            self._maybe_refresh_checkpoints(str(run_id))
        doc["checkpoints"] = dict(self._ckpt)
        # The curve is numbers only (SQLite's REAL and INTEGER columns, tuples made here): nothing
        # in it to mask, and walking its thousand points was half of a build's time.
        curve = doc.pop("curve", None)
        doc = redact_data(doc)
        if curve is not None:
            doc["curve"] = curve
        return _bounded(doc)

    def _from_ledger(self, run_id: str) -> dict[str, Any]:
        from ..ledger.livereads import METRIC_ROWS_PER_READ, metric_rows_after, recent_events
        from ..ledger.store import Ledger
        from ..report.data import ReportData, restart_markers

        if self._led is None:
            self._led = Ledger(self.state_dir, readonly=True)
        if run_id != self._run_id:  # a new run in the same state dir: its own curve
            self._run_id, self._rowid, self._curve = run_id, 0, Curve()
        rows = metric_rows_after(self._led.db, run_id, self._rowid)
        for rowid, at, step, loss, attempt in rows:
            self._curve.add(at, step, loss, attempt)
            self._rowid = rowid
        attempts = [{"attempt": a.attempt, "started_at": a.started_at, "ended_at": a.ended_at, "cause": a.cause,
                     "action": a.action, "checkpoint": a.checkpoint, "resume_step": a.resume_step}
                    for a in self._led.attempts(run_id)]
        series = self._curve.series()
        markers = restart_markers(ReportData(run_id=run_id, metrics=series, attempts=attempts,
                                             checkpoints=self._ckpt["rows"]))
        events = recent_events(self._led.db, run_id, EVENTS)
        for e in events:
            if isinstance(e.get("message"), str) and len(e["message"]) > MESSAGE_CHARS:
                e["message"] = e["message"][:MESSAGE_CHARS] + f"…(+{len(e['message']) - MESSAGE_CHARS} chars)"
        return {
            "curve": {"points": [list(p) for p in series], "rows_read": self._curve.seen, "stride": self._curve.stride,
                      "behind": len(rows) >= METRIC_ROWS_PER_READ},
            "markers": [{"attempt": m.attempt, "at": m.wall_time, "cause": m.cause, "action": m.action,
                         "resume_step": m.resume_step, "steps_redone": m.steps_redone, "label": m.label}
                        for m in markers[-MARKERS:]],
            "attempts": attempts[-MARKERS:],
            "events": events,
        }

    # -- the checkpoint table, on a thread of its own --------------------------------------------------
    def _maybe_refresh_checkpoints(self, run_id: str) -> None:
        now = self.clock()
        if self._ckpt_running or now - self._ckpt_started_at < CHECKPOINTS_EVERY_S or self._closed:
            return
        self._ckpt_running, self._ckpt_started_at = True, now
        threading.Thread(target=self._checkpoints, args=(run_id,), daemon=True, name="web-checkpoints").start()

    def _checkpoints(self, run_id: str) -> None:
        from ..ledger.store import Ledger
        from ..report.collect import _checkpoint_rows  # the report's table: one quicklist for both

        try:
            led = Ledger(self.state_dir, readonly=True)
            try:
                rows = _checkpoint_rows(led, run_id, self.state_dir)
            finally:
                led.close()
            shown = [{"path": r.get("path"), "step": r.get("step"), "ready": r.get("ready"),
                      "reasons": list(r.get("reasons") or [])[:3], "val_metric": r.get("val_metric"),
                      "load_test": load_test_word(r.get("load_test"))} for r in rows[:CHECKPOINT_ROWS]]
            self._ckpt = {"rows": shown, "as_of": time.time(), "error": None, "more": max(0, len(rows) - CHECKPOINT_ROWS)}
        except Exception as e:  # the table only: the rest of the page goes on
            self._ckpt = {**self._ckpt, "error": f"the checkpoint table could not be read: {e}"}
        finally:
            self._ckpt_running = False

    def _close_ledger(self) -> None:
        led, self._led = self._led, None
        if led is not None:
            try:
                led.close()
            except Exception:
                pass  # it is being given up anyway

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._close_ledger()


def load_test_word(lt: Mapping[str, Any] | None) -> str | None:
    """The page's word for a checkpoint's load test, as the ``checkpoints`` verb says it: a test
    that could not run (no torch in the job's Python) is no failure of the checkpoint, and a
    refused one that loaded is no pass (None: none ran)."""
    if not lt:
        return None
    if lt.get("untested"):
        return "not tested"
    if lt.get("refused"):
        return "refused"
    return "passed" if lt.get("passed") else "failed"


def _bounded(doc: dict[str, Any]) -> bytes:
    """The document as JSON of at most ``MAX_BYTES``: past it the curve is thinned, then the
    events and checkpoints cut, then the status kept to its headline (said in ``cut``)."""
    out = strictjson.dumps(doc, default=str).encode()
    steps: list[Callable[[dict[str, Any]], None]] = [
        lambda d: d.get("curve", {}).update(points=d.get("curve", {}).get("points", [])[::4]),
        lambda d: d.update(events=d.get("events", [])[:5], attempts=d.get("attempts", [])[-20:],
                           markers=d.get("markers", [])[-20:]),
        lambda d: d.update(checkpoints={"rows": [], "error": "left out: the page's document was too large"}),
        lambda d: d.update(status={k: d["status"].get(k) for k in ("state", "phase", "run_id", "name", "attempt",
                                                                   "restarts_by_cause", "max_restarts")}),
        lambda d: d.update(curve={"points": []}, events=[], attempts=[], markers=[]),
    ]
    for cut in steps:
        if len(out) <= MAX_BYTES:
            break
        cut(doc)
        doc["cut"] = f"the document was over {MAX_BYTES} bytes: parts were left out"
        out = strictjson.dumps(doc, default=str).encode()
    if len(out) > MAX_BYTES:  # a headline past a megabyte (a name that long): the state alone
        out = strictjson.dumps({"status": {"state": str(doc["status"].get("state"))[:100]}, "cut": doc["cut"]}).encode()
    return out
