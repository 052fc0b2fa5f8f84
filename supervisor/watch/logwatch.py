"""The job's output -> metric records and detections (the :class:`LineSink` the readers feed).

Speed comes from not looking: a batch of lines is joined once and scanned with ``str.find`` for
the few literal keywords any metric line or detector rule must contain (C speed, gigabytes per
second). Only the lines around a hit are parsed and shown to the detectors; ordinary output
costs one join and a handful of ``find`` calls per batch. Measured in ``bench/bench_watch.py``.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from typing import Callable, Mapping, Protocol, Sequence

import structlog

from ..events import Cause, Emit, MetricSink
from ..core.observations import Detection, MetricRecord
from ..logsite import log_helper
from .config import DetectorsConfig
from .detectors import Detector, NanDetector, build_detectors
from .epochsteps import EpochSteps
from .blind import BlindWatch, Notice
from .nanahead import NanAhead
from .records import record_evidence
from .nannotes import NanNotes
from .parsers import METRIC_KEYWORDS, MetricParser
from .sources import CLIENT_METRICS_MARKER, SourceBook, origin_of
from .unparsed import UnreadLines

log = structlog.get_logger("supervisor.watch")

# Text detectors look at most at this much of one line: the evidence is at the start, and a
# megabyte line must not cost a megabyte of regex work per rule.
_MAX_SCAN_CHARS = 8192


class ProgressSink(Protocol):
    """Told when output or training progress is seen (the heartbeat monitor's liveness checks)."""

    def note_output(self, now: float, line: str | None = None) -> None: ...

    def note_step(self, now: float, step: int | None, origin: str = "", lag: float = 0.0) -> None: ...


class LogWatcher:
    """Parses lines into metrics and runs the detectors; thread-safe ``feed``.

    Emits each :class:`Detection` through ``emit`` and each parsed :class:`MetricRecord` through
    ``on_metric`` (both called outside the internal lock, from the feeding thread). Call
    ``reset(attempt, resume_step)`` before each attempt's output starts flowing: detectors fire
    once per attempt per cause, and the loss-spike warm-up restarts at ``resume_step``.
    ``progress`` (optional) is told about every batch of output and every new step.

    Steps for formats that print none (HF Trainer's log dicts): a trainer's tqdm training bar
    (``fmt="progress"`` records: the bar's position is the global step, also after a resume) gives
    the step, and a stepless record takes the bar's latest position. The bar is redrawn on stderr
    while the dict goes to stdout, so the position can trail the dict by the bar's refresh
    interval (0.1 s): an onset read from it is early, never late, which is the safe side for a
    rollback. Progress records feed liveness and step tracking only; they are not metrics.
    A counter that restarts every epoch (``epoch 1 | iter 50``, Lightning's ``Epoch 1: 50/100``)
    becomes the global step before anything judges the record (:mod:`.epochsteps`).
    """

    name = "logwatch"

    def __init__(self, cfg: DetectorsConfig, emit: Emit, on_metric: MetricSink, *,
                 progress: ProgressSink | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self._emit = emit
        self._on_metric = on_metric
        self._progress = progress
        self._clock = clock
        self._lock = threading.Lock()
        self._parser = MetricParser(cfg.parsers.regexes, auto=cfg.parsers.auto,
                                    max_line_chars=cfg.parsers.max_line_chars)
        self._detectors: list[Detector] = build_detectors(cfg)
        # keyword -> bitmask of who wants a line containing it: bit 0 the parser, bit i+1 detector i.
        masks: dict[str, int] = {}
        if cfg.parsers.auto:
            for kw in METRIC_KEYWORDS:
                masks[kw] = masks.get(kw, 0) | 1
        for i, d in enumerate(self._detectors):
            for kw in d.keywords:
                masks[kw] = masks.get(kw, 0) | (2 << i)
        self._all_mask = (2 << len(self._detectors)) - 1
        self._scan_all = "" in masks
        masks.pop("", None)
        self._keywords = tuple(sorted(masks.items()))
        # The NaN warnings (nan_mentioned, eval_nonfinite): their notices wait here for the main loop.
        self._noters = [d for d in self._detectors if isinstance(d, NanNotes)]
        # A NaN found ahead of the in-order reading while it is behind a burst (feed_ahead).
        self._ahead = NanAhead(cfg) if any(isinstance(d, NanDetector) for d in self._detectors) else None
        self._notices: list[Notice] = []
        # Detectors that judge metric records (run on every parsed record).
        self._metric_mask = sum(2 << i for i, d in enumerate(self._detectors) if d.wants_metrics)
        # User regexes are matched over the whole batch at once (MULTILINE), then per hit line.
        self._user_rx = tuple(re.compile(p, re.MULTILINE) for p in cfg.parsers.regexes)
        self._attempt = 0
        self._last: MetricRecord | None = None
        self._last_step: int | None = None
        self._max_step: int | None = None
        self._bar_seen = False  # a training progress bar gave this attempt's step
        self._bar_total: float | None = None  # that bar's total: other bars (evaluate()) are not it
        self._resume_step: int | None = None  # the attempt's (reset)
        self._loop_bar_total: float | None = None  # a loop's tqdm bar's total on a fresh start (kept across attempts)
        self._epochs = EpochSteps()  # epoch-local counters -> global steps (learned across attempts)
        self._last_detection: Detection | None = None
        self._detections = 0
        self._lines = 0
        self._records = 0
        self._formats: dict[str, int] = {}
        self._failed_once = False
        self._fired: set[Cause] = set()
        # What each source yielded (status: metric_sources), and the blind bound (metrics_blind).
        self.sources = SourceBook(clock)
        self.unread = UnreadLines(self.sources, clock)  # lines that start like a record but gave none: said
        self.blind = BlindWatch(cfg.blind_after_lines, cfg.blind_after_s, user_regexes=cfg.parsers.regexes,
                                started_at=clock())

    def set_progress(self, progress: ProgressSink | None) -> None:
        """Attach the stall-timeout sink after construction (the HeartbeatMonitor takes this
        watcher as its metrics sink, so one of the two is built first)."""
        self._progress = progress

    # -- LineSink -------------------------------------------------------------------------

    def feed(self, source: str, lines: Sequence[str]) -> None:
        if not lines:
            return
        try:
            with self._lock:
                records, detections, steps = self._process(source, lines)
                self._collect_notices()
        except Exception as exc:  # a sink must never raise into the reader thread
            self._failed("logwatch_failed", exc, "this batch is skipped; later batches are still processed")
            return
        self._deliver(detections, records, steps, lines[-1], origin=origin_of(source, False))

    def feed_ahead(self, source: str, lines: Sequence[str]) -> None:
        """A non-finite value found ahead of the in-order reading (seconds behind the job), the lines
        before it first: judged now (:mod:`.nanahead`); the lines still come through :meth:`feed`."""
        with self._lock:
            det = None if self._ahead is None or Cause.NAN in self._fired else self._ahead.judge(source, lines)
            if det is None:
                return
            self._fired.add(det.cause)
            self._detections += 1
            self._last_detection = det
        self._deliver([det], (), (), None)

    def feed_records(self, source: str, records: Sequence[MetricRecord]) -> None:
        """Records read from a file the job writes (:mod:`.metricfiles`: TensorBoard, CSV, JSONL),
        through the same bookkeeping as parsed lines: step tracking, the per-source book, the
        metric detectors (NaN, loss spike), new steps to the progress sink (output liveness learns
        the step rhythm from them: a Lightning job that prints nothing per step is still judged),
        then ``on_metric``. Thread-safe; never raises."""
        if not records:
            return
        try:
            with self._lock:
                kept, detections, steps, walls = self._process_records(source, records)
                self._collect_notices()
        except Exception as exc:  # a sink must never raise into the reader thread
            self._failed("logwatch_failed", exc, "these records are skipped; later ones are still processed")
            return
        self._deliver(detections, kept, steps, None, walls, origin_of(source, True))

    def _process_records(self, source: str, records: Sequence[MetricRecord]
                         ) -> tuple[list[MetricRecord], list[Detection], list[int | None], list[float]]:
        detections: list[Detection] = []
        steps: list[int | None] = []
        walls: list[float] = []  # each new step's wall time (a TensorBoard scalar's own: when it was logged)
        metric_detectors = [d for d in self._detectors if d.wants_metrics]
        kept: list[MetricRecord] = []
        for rec in records:
            if "epoch" in rec.extra:
                rec = self._epochs.globalize(source, rec)  # a JSONL file's {"epoch": 1, "iter": 50}
            kept.append(rec)
            if rec.step is None:
                if rec.loss is not None or rec.grad_norm is not None:
                    steps.append(None)
                    walls.append(rec.at)
            else:
                if self._max_step is None or rec.step > self._max_step:
                    steps.append(rec.step)
                    walls.append(rec.at)
                    self._max_step = rec.step
                self._last_step = rec.step
            self._last = rec
            self._records += 1
            self._formats[rec.fmt] = self._formats.get(rec.fmt, 0) + 1
            self._noted(source, rec)
            evidence = record_evidence(source, rec)
            for det in metric_detectors:
                d = det.observe(source, evidence, rec, self._last_step)
                if d is not None and d.cause not in self._fired:
                    self._fired.add(d.cause)
                    self._detections += 1
                    self._last_detection = d
                    detections.append(d)
        return kept, detections, steps, walls

    def _deliver(self, detections: Sequence[Detection], records: Sequence[MetricRecord],
                 steps: Sequence[int | None], last_line: str | None, walls: Sequence[float] | None = None,
                 origin: str = "") -> None:
        # Detections first: a failing metric callback must not delay or swallow an anomaly.
        for det in detections:
            log.warning("anomaly_detected", cause=det.cause.value, summary=det.summary, source=det.source,
                        step=det.step, onset_step=det.onset_step, evidence=det.evidence,
                        next="the runner's policy decides what happens to the attempt")
            try:
                self._emit(det)
            except Exception as exc:
                self._failed("logwatch_emit_failed", exc, "the detection is lost; watching continues")
        try:
            if self._progress is not None:
                now = self._clock()
                self._progress.note_output(now, last_line)
                if walls is None:
                    for step in steps:
                        self._progress.note_step(now, step, origin)
                else:
                    # Steps read from a file arrive in bursts (one per read); their own wall times,
                    # moved onto our clock, give liveness the job's real step rhythm (and how late
                    # the file shows them: a writer that flushes every 2 min).
                    wall, at = time.time(), float("-inf")
                    for step, w in zip(steps, walls):
                        at = max(at, min(now, now - (wall - w)))
                        self._progress.note_step(at, step, origin, now - at)
            for rec in records:
                self._on_metric(rec)
        except Exception as exc:
            self._failed("logwatch_metric_sink_failed", exc, "metrics of this batch are skipped; watching continues")

    @log_helper
    def _failed(self, event: str, exc: BaseException, next_: str) -> None:
        if not self._failed_once:  # once: a broken callback must not flood the log
            self._failed_once = True
            log.error(event, error=repr(exc), next=next_, exc_info=exc)

    def _candidates(self, text: str) -> list[tuple[int, tuple[int, int]]]:
        """(start, (end, mask)) of every line in ``text`` with a keyword or a user-regex match."""
        spans: dict[int, tuple[int, int]] = {}
        find = text.find
        rfind = text.rfind
        get = spans.get
        for kw, mask in self._keywords:
            pos = find(kw)
            while pos != -1:
                start = rfind("\n", 0, pos) + 1
                end = find("\n", pos)
                if end == -1:
                    end = len(text)
                prev = get(start)
                spans[start] = (end, mask if prev is None else prev[1] | mask)
                pos = find(kw, end)
        for rx in self._user_rx:
            for m in rx.finditer(text):
                start = rfind("\n", 0, m.start()) + 1
                end = find("\n", m.start())
                prev = get(start)
                spans[start] = (end if end != -1 else len(text), 1 if prev is None else prev[1] | 1)
        return sorted(spans.items())

    def _process(self, source: str, lines: Sequence[str]
                 ) -> tuple[list[MetricRecord], list[Detection], list[int | None]]:
        self._lines += len(lines)
        self.blind.lines(lines, self._clock())
        if self._scan_all or self._parser.wants_all_lines(source):
            # A CSV metrics file (after its header) or llm.c's main.log: metric lines there carry
            # no keyword, so every line goes to the parser (such files grow a line per step).
            selected: Sequence[tuple[str, int]] = [(line, self._all_mask) for line in lines]
        else:
            text = "\n".join(lines)
            selected = [(text[s:e], mask) for s, (e, mask) in self._candidates(text)]
        records: list[MetricRecord] = []
        detections: list[Detection] = []
        steps: list[int | None] = []  # new training steps seen, for liveness
        client = CLIENT_METRICS_MARKER in source
        for line, mask in selected:
            try:
                self._line(source, line, mask, client, records, detections, steps)
            except Exception as exc:  # one bad line loses itself, never its batch
                self._failed("logwatch_line_failed", exc,
                             "this line is skipped; the rest of its batch is still parsed and judged")
        return records, detections, steps

    def _line(self, source: str, line: str, mask: int, client: bool, records: list[MetricRecord],
              detections: list[Detection], steps: list[int | None]) -> None:
        rec = self._parser.parse(line, source) if mask & 1 else None
        if rec is not None and rec.fmt == "progress":
            total = rec.extra.get("total")
            if self._bar_total is None:
                self._bar_total = total  # the first bar of an attempt is the training bar
            elif total != self._bar_total:
                return  # another bar (a standalone evaluate(), a data loader's)
            # A bar at 0 has done nothing yet (HF draws 0/N before jumping to a resumed step).
            # Its first position counts even below the resume step, and stepless records
            # take no step before it: a job that ignored its checkpoint starts over at 1, and
            # that must show (resume_ignored), not be booked as the resume step.
            if rec.step and (self._max_step is None or rec.step > self._max_step or not self._bar_seen):
                self._max_step = self._last_step = rec.step
                steps.append(rec.step)
            if rec.step:
                self._bar_seen = True
            self._formats["progress"] = self._formats.get("progress", 0) + 1
            if rec.step:
                self._noted(source, rec)
            return  # a bar position is not a metric, and no detector judges it
        if rec is not None:
            mask |= self._metric_mask
            if rec.fmt == "tqdm" and rec.step is not None:
                rec = self._loop_bar_step(rec)
            elif "epoch" in rec.extra:
                rec = self._epochs.globalize(source, rec)  # "epoch 1 | iter 50": step 150, not 50
            if client:
                rec = dataclasses.replace(rec, fmt="client")
            elif rec.step is None and self._bar_seen and self._last_step is not None:
                rec = dataclasses.replace(rec, step=self._last_step, extra={**rec.extra, "step_from_bar": 1.0})
            if rec.step is None:
                if rec.loss is not None or rec.grad_norm is not None:
                    steps.append(None)  # a training log line that names no step
            elif self._max_step is None or rec.step > self._max_step:
                steps.append(rec.step)
            if rec.step is not None:
                self._last_step = rec.step
                if self._max_step is None or rec.step > self._max_step:
                    self._max_step = rec.step
            self._last = rec
            self._records += 1
            self._formats[rec.fmt] = self._formats.get(rec.fmt, 0) + 1
            self._noted(source, rec)
            records.append(rec)
        elif mask & 1 and '{"' in line:
            self.unread.line(source, line, self._parser.max_line_chars)  # a JSON metric line no reader read: said
        if mask < 2:
            return
        scan = line if len(line) <= _MAX_SCAN_CHARS else line[:_MAX_SCAN_CHARS]
        bit = 2
        for det in self._detectors:
            if mask & bit:
                d = det.observe(source, scan, rec, self._last_step)
                if d is not None and d.cause not in self._fired:
                    # One detection per cause per attempt, whichever detector saw it first.
                    self._fired.add(d.cause)
                    self._detections += 1
                    self._last_detection = d
                    detections.append(d)
            bit <<= 1

    def _loop_bar_step(self, rec: MetricRecord) -> MetricRecord:
        """A loop's tqdm bar (``tqdm`` records) built as ``tqdm(range(start, n))`` without
        ``initial=start`` counts from 0 again after a resume, with ``n - start`` as its total: seen so
        (the first attempt's total minus the resume step), its counter is shifted by the resume step,
        else the steps would read as a job that ignored its checkpoint."""
        total = rec.extra.get("total")
        if self._loop_bar_total is None:
            if not self._resume_step:
                self._loop_bar_total = total  # a fresh start shows the whole run's bar
            return rec
        r = self._resume_step
        if r and rec.step is not None and total is not None and total != self._loop_bar_total \
                and total + r == self._loop_bar_total:
            return dataclasses.replace(rec, step=rec.step + r, extra={**rec.extra, "step_offset": float(r)})
        return rec

    def _noted(self, source: str, rec: MetricRecord) -> None:
        """Every record, parsed from a line or read from a metric file: the per-source book and
        the blind bound (a record is what ends blindness)."""
        self.sources.note(source, rec.fmt, rec.step)
        self.blind.stepped(source, rec.fmt, rec.step)

    def note_unread(self, source: str, line: str, why: str) -> None:
        """A metric file's line that starts like a record but gave none (:mod:`.unparsed`); thread-safe."""
        with self._lock:
            self.unread.note(source, line, why)

    def _collect_notices(self) -> None:
        for n in self._noters:
            if n.pending:
                self._notices.extend(n.take())
        if len(self._notices) > 64:  # nobody takes them (no main loop): keep the first, bounded
            del self._notices[64:]

    def take_notices(self) -> list[Notice]:
        """The ``nan_mentioned`` / ``eval_nonfinite`` / ``metric_lines_unread`` warnings seen since the last
        call, oldest first of each kind (the main loop logs them: the watch plug-in's tick returns them as notes)."""
        with self._lock:
            out, self._notices = [*self._notices, *self.unread.take()], []
        return out

    def blind_notice(self, now: float) -> Notice | None:
        """The ``metrics_blind`` / ``metrics_seen`` notice due now (the main loop logs it)."""
        return self.blind.check(now)

    # -- attempt lifecycle and status ------------------------------------------------------

    def reset(self, attempt: int, resume_step: int | None) -> None:
        """Start watching a new attempt: detectors re-armed, step tracking from ``resume_step``."""
        with self._lock:
            self._attempt = attempt
            self._last_step = resume_step
            self._max_step = resume_step
            self._resume_step = resume_step
            self._bar_seen = False
            self._bar_total = None
            self._epochs.reset(resume_step)
            self._fired.clear()
            self.unread.reset(attempt)
            for d in self._detectors:
                d.reset(resume_step)
        self.blind.reset(self._clock())  # the attempt's run time counts from here (metrics_blind)

    def last_metric(self) -> MetricRecord | None:
        return self._last

    def status(self) -> Mapping[str, object]:
        last = self._last
        det = self._last_detection
        return {
            "attempt": self._attempt,
            "lines": self._lines,
            "metric_records": self._records,
            "formats": dict(self._formats),
            "detections": self._detections,
            "last_metric": None if last is None else metric_dict(last),
            "last_anomaly": None if det is None else {
                "cause": det.cause.value, "summary": det.summary, "step": det.step,
                "onset_step": det.onset_step, "source": det.source, "evidence": det.evidence, "at": det.at},
            "detectors": [d.cause.value for d in self._detectors],
            "metric_sources": self.sources.snapshot(),
            "metrics_blind": self.blind.status(),
        }


def metric_dict(rec: MetricRecord) -> dict[str, object]:
    """The ``last_metric`` shape of ``status --json``: only the fields that have a value."""
    out: dict[str, object] = {"step": rec.step}
    for name in ("loss", "grad_norm", "lr", "tokens_per_sec", "val_loss", "rank"):
        v = getattr(rec, name)
        if v is not None:
            out[name] = v
    out["fmt"] = rec.fmt
    out["source"] = rec.source
    out["at"] = rec.at
    return out
