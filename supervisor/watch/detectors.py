"""Anomaly detectors over the (line, metric record) stream of one attempt.

Each detector is a small stateful object, pure apart from its own state: ``observe(source, line,
record)`` returns a :class:`~supervisor.events.Detection` or None. Detectors never act; the log
watcher emits what they return. Each fires at most once per attempt (``reset`` starts the next
attempt), because one NaN printed by eight ranks is one failure, not eight.

``keywords`` lists substrings that any line a detector cares about must contain; the log watcher
only hands a detector lines that contain one of the union of keywords (or that parsed as a
metric), which is what keeps ingestion at hundreds of thousands of lines per second.

Classification choices (SPEC causes):

- ``oom``: CUDA/HIP out of memory, ``torch.OutOfMemoryError``, ``CUBLAS_STATUS_ALLOC_FAILED``,
  ``cudaErrorMemoryAllocation``, host ``MemoryError`` and ``std::bad_alloc``.
- ``nccl_timeout``: NCCL watchdog collective timeouts, ProcessGroupNCCL errors, aborted
  communicators, NCCL error codes. A restart from the last checkpoint is the right first answer
  to those; if they repeat, the policy's crash-loop guard gives up.
- ``crash`` (from the log, before the exit says it): a CUDA error (``CUDA error: ...``: an illegal
  memory access, a device-side assert, an unspecified launch failure, a ``CUBLAS_STATUS_...``,
  ``cuDNN error: ...``), with the CUDA message as its summary; also when NCCL's watchdog reports
  it. Its out-of-memory forms stay ``oom``, its driver forms ``gpu_fault``
  (``textrules.CUDA_NOT_CRASH``); the corpus of real messages is ``tests/corpus/gpu_errors/``.
- ``gpu_fault``: ``NVRM: Xid`` lines, uncorrectable ECC errors, "GPU is lost" and the driver's
  "CUDA error: unknown error" / "device not ready" seen in the log. Xids that mean the node needs
  a human (48 DBE, 79 fell off the bus, 64/92/94/95 ECC) carry ``suggested_action=give_up``.
- ``checkpoint_load_error``: missing / unexpected keys, size mismatch, PytorchStreamReader
  failures, unexpected EOF, weights-only load failures, unpickling and safetensors header errors.
- ``nan``: a non-finite *value* in ``[detectors.nan] fields`` (training loss and grad norm by
  default; ``val_loss`` when named there) or Megatron's NaN-iteration count above 0, in
  ``consecutive`` records, plus the user's ``patterns``. A line that only speaks of NaN ("0 NaN
  detected", AMP's "inf in grads") and a NaN only in an eval metric are warnings
  (:mod:`.nannotes`: ``nan_mentioned``, ``eval_nonfinite``), never a detection.
- ``loss_spike``: see :class:`LossSpikeDetector`.
"""

from __future__ import annotations

import math
import re
import time
from collections import deque
from dataclasses import dataclass
from statistics import median
from typing import Callable, Protocol, Sequence

from ..events import Action, Cause
from ..core.observations import Detection, MetricRecord
from ..health.xid import classify_xid
from ..redact import redact_line
from .config import DetectorsConfig, LossSpikeConfig, NanDetectorConfig, TextDetectorConfig
from .nannotes import NAN_ITERATIONS, NanNotes, overflow_skip
from .lossscale import ScaleStreaks
from .textrules import (CKPT_KEYWORDS, CKPT_RULES, CUDA_ANCHORS, CUDA_ERROR, GPU_RULES, NCCL_CUDA_OOM, NCCL_KEYWORDS,
                        NCCL_RULES, NCCL_UNHANDLED, OOM_KEYWORDS, OOM_RULES, XID_LINE, TextRule)


def truncate(text: str, limit: int) -> str:
    """A job's line as evidence (ledger, log, alerts): secrets masked by supervisor.redact (which
    also says where it cut), at most ``limit`` characters."""
    shown = redact_line(text.rstrip(), limit=limit)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


class Detector(Protocol):
    cause: Cause
    keywords: tuple[str, ...]
    wants_metrics: bool

    def observe(self, source: str, line: str, rec: MetricRecord | None, step: int | None) -> Detection | None: ...

    def reset(self, resume_step: int | None) -> None: ...


class TextDetector:
    """Fires on the first line that matches any rule (first matching rule names the summary)."""

    wants_metrics = False

    def __init__(self, cause: Cause, rules: Sequence[TextRule], keywords: Sequence[str],
                 cfg: TextDetectorConfig, evidence_chars: int) -> None:
        self.cause = cause
        extra = [TextRule(cause, re.compile(p), f"{cause.value} (pattern {p!r})") for p in cfg.patterns]
        self.rules = list(rules) + extra
        # User patterns have no known literal, so they cannot be prefiltered: an empty keyword
        # means "every line" (documented cost: the ingestion rate drops when you add patterns).
        self.keywords = tuple(keywords) + (("",) if extra else ())
        self.evidence_chars = evidence_chars
        self.fired: set[Cause] = set()

    def reset(self, resume_step: int | None) -> None:
        self.fired.clear()

    def observe(self, source: str, line: str, rec: MetricRecord | None, step: int | None) -> Detection | None:
        for rule in self.rules:
            anchors = rule.anchors
            if anchors:
                for a in anchors:
                    if a in line:
                        break
                else:
                    continue
            if rule.cause in self.fired:
                continue
            m = rule.pattern.search(line)
            if m and (rule.unless is None or not rule.unless(line, m)):
                return self._fire(rule, m, source, line, step)
        return None

    def _fire(self, rule: TextRule, m: re.Match[str], source: str, line: str, step: int | None) -> Detection:
        self.fired.add(rule.cause)
        return Detection(cause=rule.cause, summary=f"{rule.summary} (last step {step})" if step is not None
                         else rule.summary, at=time.time(), source=source, step=step, onset_step=step,
                         evidence=truncate(line, self.evidence_chars), suggested_action=rule.action,
                         details={"pattern": rule.pattern.pattern})


class NcclDetector(TextDetector):
    """The GPU and collective lines: NCCL / driver timeouts (``nccl_timeout``), Xid / ECC / driver
    lines (``gpu_fault``) and CUDA errors (``crash``, with the CUDA message)."""

    def __init__(self, cfg: TextDetectorConfig, evidence_chars: int) -> None:
        super().__init__(Cause.NCCL_TIMEOUT, NCCL_RULES + GPU_RULES, NCCL_KEYWORDS, cfg, evidence_chars)
        self._unhandled: Detection | None = None  # NCCL's "unhandled cuda error", held for its "Last error"

    def reset(self, resume_step: int | None) -> None:
        super().reset(resume_step)
        self._unhandled = None

    def observe(self, source: str, line: str, rec: MetricRecord | None, step: int | None) -> Detection | None:
        if self._unhandled is not None:
            # NCCL's ncclUnhandledCudaError names the CUDA failure a few lines on ("Last error:" /
            # "Cuda failure 'X'"): out of memory is the OOM rule's (issue 39), anything else stays
            # this nccl_timeout, given at the next line this detector sees.
            if NCCL_UNHANDLED.search(line):
                return None
            held, self._unhandled = self._unhandled, None
            if NCCL_CUDA_OOM.search(line):
                return None
            self.fired.add(Cause.NCCL_TIMEOUT)
            return held
        if Cause.CRASH not in self.fired and any(a in line for a in CUDA_ANCHORS):
            m = CUDA_ERROR.search(line)
            # First: NCCL's watchdog reports a rank's CUDA error inside its own words ("Process group
            # watchdog thread terminated with exception: CUDA error: ..."): the CUDA error is the cause.
            if m is not None:
                return self._cuda_crash(m, source, line, step)
        if "Xid" in line and Cause.GPU_FAULT not in self.fired:
            m = XID_LINE.search(line)
            if m:
                xid = int(m.group(2))
                # One table of what each Xid means (health/xid.py), for NVML events and log lines alike:
                # the catalog's "ignore" codes (63, 92, 121) are a warning, the reset ones a give-up.
                action = classify_xid(xid).action
                fatal = action is Action.GIVE_UP
                self.fired.add(Cause.GPU_FAULT)
                return Detection(
                    at=time.time(), cause=Cause.GPU_FAULT, summary=f"GPU Xid {xid} ({m.group(1)})"
                    + ("; this Xid needs a human (drain the node)" if fatal else ""),
                    source=source, step=step, onset_step=step, value=float(xid),
                    evidence=truncate(line, self.evidence_chars),
                    suggested_action=action if action in (Action.GIVE_UP, Action.WARN) else None,
                    details={"xid": xid, "device": m.group(1)})
        d = super().observe(source, line, rec, step)
        if d is not None and d.cause is Cause.NCCL_TIMEOUT and NCCL_UNHANDLED.search(line):
            self.fired.discard(Cause.NCCL_TIMEOUT)
            self._unhandled = d
            return None
        return d

    def _cuda_crash(self, m: re.Match[str], source: str, line: str, step: int | None) -> Detection:
        self.fired.add(Cause.CRASH)
        text = m.group(0).rstrip()
        message = text if text.startswith(("CUDA error", "cuDNN error")) else f"CUDA error: {text}"
        message = truncate(message, self.evidence_chars)
        return Detection(cause=Cause.CRASH, summary=message + (f" (last step {step})" if step is not None else ""),
                         at=time.time(), source=source, step=step, onset_step=step,
                         evidence=truncate(line, self.evidence_chars),
                         details={"cuda_error": message, "pattern": CUDA_ERROR.pattern})


class NanDetector:
    """Non-finite values in ``fields`` for ``consecutive`` records of one stream (source, rank).

    ``onset_step`` is where the poison may have begun: the step after the stream's last finite
    record when that is earlier than the first non-finite record (a job that logs every 10 steps
    and prints NaN at step 50 may have diverged at step 41, and a checkpoint saved at step 45 is
    suspect), else the first non-finite record's step. Megatron's ``number of nan iterations`` above 0
    counts as a non-finite value (its loss average leaves the NaN iterations out). The user's
    ``patterns`` are a separate :class:`TextDetector` with cause ``nan``; the log watcher keeps one
    ``nan`` per attempt. Lines that only speak of NaN are :class:`~.nannotes.NanNotes`' warnings.
    """

    cause = Cause.NAN
    keywords: tuple[str, ...] = ()
    wants_metrics = True

    def __init__(self, cfg: NanDetectorConfig, evidence_chars: int) -> None:
        self.cfg = cfg
        self.fields = tuple(cfg.fields)
        self.evidence_chars = evidence_chars
        self.fired = False
        # (source, rank) -> (non-finite records in a row, step of the first, last step counted)
        self.runs: dict[tuple[str, int | None], tuple[int, int | None, int | None]] = {}
        self.last_finite: dict[tuple[str, int | None], int] = {}  # stream -> step of its last finite record
        # stream -> (skipped fp16 steps in a row: grad norm not finite, loss finite; step of the first, last)
        self.overflows: dict[tuple[str, int | None], tuple[int, int | None, int | None]] = {}
        self.scales = ScaleStreaks()  # a falling loss scale is the scaler at work: its streak does not count

    def reset(self, resume_step: int | None) -> None:
        self.fired = False
        self.runs.clear()
        self.last_finite.clear()
        self.overflows.clear()

    def _run(self, runs: dict[tuple[str, int | None], tuple[int, int | None, int | None]],
             key: tuple[str, int | None], rec: MetricRecord, step: int | None,
             needed: int) -> tuple[int, int | None, int | None] | None:
        """``rec`` counted in ``key``'s run of bad records; at ``needed`` of them (count, step, onset),
        the onset no later than just after the stream's last finite record."""
        count, onset, last = runs.get(key, (0, rec.step, None))
        if rec.step is None or rec.step != last:  # ranks printing the same step count once
            count += 1
        runs[key] = (count, onset, rec.step)
        if count < needed:
            return None
        self.fired = True
        at = rec.step if rec.step is not None else step  # a format without steps (HF) borrows the last seen
        onset = at if onset is None else onset
        ok = self.last_finite.get(key)
        if ok is not None and onset is not None and ok + 1 < onset:
            onset = ok + 1
        return count, at, onset

    def _skipped(self, source: str, line: str, rec: MetricRecord, step: int | None, value: float) -> Detection | None:
        """A step the fp16 loss scaler skipped (grad norm not finite, loss finite): a detection only at ``overflow_steps``
        in a row at a loss scale that no longer falls (:mod:`.lossscale`); one is routine (grad_overflow)."""
        key = (source, rec.rank)
        self.runs.pop(key, None)  # its loss is finite: a run of non-finite losses ends here
        if self.scales.falling(key, rec, fresh=key not in self.overflows):  # the scaler at work: the count starts over
            self.overflows[key] = (0, *self.overflows[key][1:])  # (the streak's first step stays its onset)
        run = self._run(self.overflows, key, rec, step, self.cfg.overflow_steps)
        if run is None:
            return None
        count, at, onset = run
        return Detection(
            at=rec.at, cause=Cause.NAN, source=source, step=at, onset_step=onset, value=value,
            summary=self.scales.summary(key, value, at, count, onset), evidence=truncate(line, self.evidence_chars),
            details=self.scales.details(key, count, rec.fmt))

    def observe(self, source: str, line: str, rec: MetricRecord | None, step: int | None) -> Detection | None:
        if self.fired or rec is None:
            return None
        bad = None
        for f in self.fields:
            v = getattr(rec, f)
            if v is not None and v - v != 0:  # nan - nan and inf - inf are nan: not finite
                bad = (f, v)
                break
        if bad is None and rec.extra.get(NAN_ITERATIONS, 0) > 0:
            bad = (NAN_ITERATIONS, rec.extra[NAN_ITERATIONS])
        key = (source, rec.rank)
        if bad is not None and bad[0] == "grad_norm" and overflow_skip(rec):
            return self._skipped(source, line, rec, step, bad[1])
        if self.overflows and rec.grad_norm is not None:
            self.overflows.pop(key, None)  # a finite grad norm: the scaler found a scale that works
        if bad is None:
            if rec.step is not None:
                self.last_finite[key] = rec.step
            if self.runs:
                self.runs.pop(key, None)
            return None
        run = self._run(self.runs, key, rec, step, self.cfg.consecutive)
        if run is None:
            return None
        (count, at, onset), (name, value) = run, bad
        where = f" at step {at}" if at is not None else ""
        said = f"Megatron counted {value:g} nan iterations" if name == NAN_ITERATIONS else f"{name} is {value}"
        return Detection(
            at=rec.at, cause=Cause.NAN, summary=f"{said}{where}"
            + (f" ({count} records in a row since step {onset})" if count > 1 else ""),
            source=source, step=at, onset_step=onset,
            value=value, evidence=truncate(line, self.evidence_chars),
            details={"field": name, "consecutive": count, "fmt": rec.fmt})


class LossSpikeDetector:
    """A persistent jump of the training loss above its robust rolling baseline.

    Per stream (source, rank): the baseline is the median of the last ``window`` accepted losses
    and the spread is 1.4826 x MAD (the MAD scaled to a Gaussian sigma, robust to the outliers
    that a mean/stddev would chase). A record is *high* when

        loss > median + max(z * sigma, min_rel * |median|)

    and a spike is ``patience`` high records in a row. Why these defaults:

    - ``window=50`` records: long enough that the median ignores a burst of bad batches, short
      enough to follow the normal downward trend (a falling curve sits *below* a lagging median,
      so the lag never causes a false alarm).
    - ``z=6``: healthy per-step loss noise stays within a few robust sigmas; 6 leaves margin for
      heavy-tailed batches. ``min_rel=0.2``: late in training the noise (and so sigma) becomes
      tiny, and a 2 % wiggle must not look like 6 sigma; real divergences are jumps of 50 % or more.
    - ``patience=5``: a single bad batch (one outlier) or a short burst recovers by itself, as
      large-model reports (PaLM, OPT) describe; only a persistent excursion warrants a rollback.
    - ``warmup_steps=100`` / ``min_points=20``: the first steps of a run, and of every restart,
      are unstable by nature and the baseline is not yet meaningful.

    High records never enter the baseline, so a spike cannot hide itself by moving the median.
    ``onset_step`` is the step of the first high record of the run that fired, which is what a
    rollback must go back before.
    """

    cause = Cause.LOSS_SPIKE
    keywords: tuple[str, ...] = ()
    wants_metrics = True

    def __init__(self, cfg: LossSpikeConfig, evidence_chars: int) -> None:
        self.cfg = cfg
        self.evidence_chars = evidence_chars
        self.fired = False
        self.streams: dict[tuple[str, int | None], _SpikeStream] = {}
        self.resume_step: int | None = None

    def reset(self, resume_step: int | None) -> None:
        self.fired = False
        self.streams.clear()
        self.resume_step = resume_step

    def observe(self, source: str, line: str, rec: MetricRecord | None, step: int | None) -> Detection | None:
        if self.fired or rec is None or rec.loss is None or not math.isfinite(rec.loss):
            return None
        if rec.extra.get("eval"):
            return None
        key = (source, rec.rank)
        st = self.streams.get(key)
        if st is None:
            st = self.streams[key] = _SpikeStream(self.cfg.window, self.resume_step)
        det = st.add(rec, self.cfg)
        if det is None:
            return None
        onset, median_, threshold, count = det
        self.fired = True
        return Detection(
            at=rec.at, cause=Cause.LOSS_SPIKE,
            summary=(f"loss {rec.loss:.4g} at step {rec.step} stayed above {threshold:.4g} (baseline median "
                     f"{median_:.4g}) for {count} records since step {onset}"),
            source=source, step=rec.step, onset_step=onset, value=rec.loss,
            evidence=truncate(line, self.evidence_chars),
            details={"median": median_, "threshold": threshold, "patience": self.cfg.patience,
                     "window": self.cfg.window})


class _SpikeStream:
    __slots__ = ("window", "first_step", "count", "last_step", "high", "onset", "_cache", "_stale")

    def __init__(self, window: int, resume_step: int | None) -> None:
        self.window: deque[float] = deque(maxlen=window)
        self.first_step = resume_step
        self.count = 0  # records seen (the step when the format prints none)
        self.last_step: int | None = None
        self.high = 0
        self.onset: int | None = None
        self._cache: tuple[float, float] | None = None
        self._stale = 0

    def _baseline(self) -> tuple[float, float]:
        # Recomputed every few accepted records, not every record: a baseline over 50 records
        # is no worse for lagging by a handful, and median + MAD is the costly part of a record.
        if self._cache is None or self._stale >= max(1, len(self.window) // 5):
            self._stale = 0
            med = median(self.window)
            mad = median(abs(x - med) for x in self.window)
            self._cache = (med, 1.4826 * mad)
        return self._cache

    def add(self, rec: MetricRecord, cfg: LossSpikeConfig) -> tuple[int | None, float, float, int] | None:
        self.count += 1
        step = rec.step if rec.step is not None else self.count
        if self.last_step is not None and step <= self.last_step:
            return None  # a duplicate print of a step already judged
        self.last_step = step
        if self.first_step is None:
            self.first_step = step
        loss = rec.loss
        assert loss is not None
        if step - self.first_step < cfg.warmup_steps:
            self._accept(loss)
            return None
        if len(self.window) < min(cfg.min_points, cfg.window):
            self._accept(loss)
            return None
        med, sigma = self._baseline()
        threshold = med + max(cfg.z * sigma, cfg.min_rel * abs(med), 1e-12)
        if loss > threshold:
            if self.high == 0:
                self.onset = rec.step
            self.high += 1
            if self.high >= cfg.patience:
                return self.onset, med, threshold, self.high
            return None
        self.high = 0
        self.onset = None
        self._accept(loss)
        return None

    def _accept(self, loss: float) -> None:
        self.window.append(loss)
        self._stale += 1


@dataclass(frozen=True)
class DetectorSpec:
    """One ``[detectors.<name>]`` table and the detectors it builds when ``enabled``.

    ``classes`` lists every class ``build`` may return: ``tests/watch/test_detector_registry.py``
    fails on a class with a detector's ``observe`` anywhere in ``supervisor/`` that no spec lists,
    and on a detector table of ``DetectorsConfig`` that no spec names."""

    name: str
    classes: tuple[type, ...]
    build: Callable[[DetectorsConfig, int], list[Detector]]


def _nan(cfg: DetectorsConfig, ev: int) -> list[Detector]:
    out: list[Detector] = [NanDetector(cfg.nan, ev)]
    if cfg.nan.patterns:  # the user's lines that mean NaN: the only text that stops a job
        out.append(TextDetector(Cause.NAN, [], (), TextDetectorConfig(patterns=cfg.nan.patterns), ev))
    out.append(NanNotes(text=cfg.nan.text, eval_fields_judged="val_loss" in cfg.nan.fields, evidence_chars=ev,
                        overflow_steps=cfg.nan.overflow_steps))
    return out


# In the order they see each line.
DETECTORS: tuple[DetectorSpec, ...] = (
    DetectorSpec("nan", (NanDetector, TextDetector, NanNotes), _nan),
    DetectorSpec("loss_spike", (LossSpikeDetector,), lambda cfg, ev: [LossSpikeDetector(cfg.loss_spike, ev)]),
    DetectorSpec("oom", (TextDetector,),
                 lambda cfg, ev: [TextDetector(Cause.OOM, OOM_RULES, OOM_KEYWORDS, cfg.oom, ev)]),
    DetectorSpec("nccl_timeout", (NcclDetector,), lambda cfg, ev: [NcclDetector(cfg.nccl_timeout, ev)]),
    DetectorSpec("checkpoint_load_error", (TextDetector,),
                 lambda cfg, ev: [TextDetector(Cause.CHECKPOINT_LOAD_ERROR, CKPT_RULES, CKPT_KEYWORDS,
                                               cfg.checkpoint_load_error, ev)]),
)


def build_detectors(cfg: DetectorsConfig) -> list[Detector]:
    """The enabled detectors (``DETECTORS``), in the order they see each line."""
    return [d for spec in DETECTORS if getattr(cfg, spec.name).enabled
            for d in spec.build(cfg, cfg.evidence_chars)]
