"""The NaN warnings that never stop a job: ``nan_mentioned`` and ``eval_nonfinite``.

A NaN is a *value* in a metric (a parsed field, a metric file, the client); only
:class:`~supervisor.watch.detectors.NanDetector` turns one into a detection (rollback). Two
things look like one and are not:

- A line that speaks of NaN/inf without a non-finite value in it: a sanity counter ("0 NaN
  detected in the last 50 steps"), a question ("loss is NaN? False"), AMP's loss scaler
  ("Detected inf in grads, reducing loss scale"), or a trainer's own message before it exits
  ("Loss is nan, stopping training": the exit is then a crash). Such a line at the same step after
  a restart looked like a deterministic failure and gave up on healthy runs. Now: ``nan_mentioned``,
  a warning once per run with the line (redacted, bounded), so a human can turn it into a rule
  (``[detectors.nan] patterns``) where it does mean a divergence.
- A non-finite value only in an eval metric (``val_loss``, ``eval_loss``, ``eval/...``,
  ``validation/...``, ``test_loss``) while the training loss is finite: an empty or broken
  validation loader, not a diverged model. Rolling back cannot fix it, and the same NaN at the same
  step after the rollback gave up at step 50 of 300. Now: ``eval_nonfinite``, a warning (notified by
  default) once per attempt and metric (at most 8 an attempt), unless ``[detectors.nan] fields`` names ``val_loss`` (then
  the NanDetector rolls back on it).

:class:`NanNotes` has the detector shape (the log watcher routes lines and records to it by
keyword like any detector) but never returns a detection: its notices are taken by the log
watcher and logged on the daemon's main loop.
"""

from __future__ import annotations

import math
import re
from typing import Mapping

from ..events import Cause
from ..core.observations import Detection, MetricRecord
from ..redact import redact_line
from ..levels import Level
from .blind import Notice
from .textrules import NAN_TEXT_KEYWORDS, NAN_TEXT_RULES

#: Megatron-LM's count of iterations with a NaN loss in the logging interval (an ``extra`` field of
#: its iteration line): a value > 0 is a non-finite training value, judged by the NanDetector.
NAN_ITERATIONS = "number of nan iterations"
SKIPPED_ITERATIONS = "number of skipped iterations"  # Megatron's count of steps its loss scaler skipped
_SCALER_KEY = re.compile(r"(?i)scale")  # loss_scale, "loss scale", scaler, grad_scale: a dynamic loss scaler's

# An eval metric's key, anywhere in a path: val_loss, eval/accuracy, validation/loss, test_loss,
# metrics/val_ppl. (val_loss itself is a record field: the parsers map eval_loss, val/loss, ... to it.)
#: eval_nonfinite notices per attempt, and metrics named in one: a job printing ever new eval keys
#: with NaN must not flood the ledger and the pager (the count is said in the last one).
MAX_EVAL_NOTICES = 8
MAX_EVAL_FIELDS = 8

_EVAL_KEY = re.compile(r"(?i)(?:^|[/.])(?:val|valid|validation|eval|evaluation|test)(?:[/_.\- ]|$)")


def is_eval_key(key: str) -> bool:
    """True for the name of an evaluation metric (``eval/accuracy``, ``test_loss``, ``val_ppl``)."""
    return _EVAL_KEY.search(key) is not None


def _bad(v: float | None) -> bool:
    return v is not None and v - v != 0  # nan - nan and inf - inf are nan: not finite


def has_nonfinite_value(rec: MetricRecord) -> bool:
    """The record holds a non-finite value (or Megatron's NaN-iteration count above 0)."""
    if _bad(rec.loss) or _bad(rec.grad_norm) or _bad(rec.val_loss) or rec.extra.get(NAN_ITERATIONS, 0) > 0:
        return True
    return any(_bad(v) for v in rec.extra.values())


def overflow_skip(rec: MetricRecord) -> bool:
    """A step the fp16 loss scaler skipped: its grad norm is infinite (the scaled gradients
    overflowed) while its loss is finite, or not finite beside a loss scale or a skipped-iteration
    count in the same record. AMP's GradScaler, DeepSpeed and the HF Trainer print it and go on with a
    smaller scale; only many in a row while the printed scale no longer falls (``[detectors.nan]
    overflow_steps``, :mod:`.lossscale`) are a divergence. A NaN
    grad norm with nothing of a scaler beside it is not one: HF's default ``logging_nan_inf_filter``
    prints a diverged run exactly so (a finite loss, ``'grad_norm': nan``), and that fires at once."""
    g = rec.grad_norm
    if g is None or g - g == 0 or rec.loss is None or rec.loss - rec.loss != 0 or rec.extra.get(NAN_ITERATIONS, 0) > 0:
        return False
    return math.isinf(g) or any(_SCALER_KEY.search(k) for k in rec.extra) or rec.extra.get(SKIPPED_ITERATIONS, 0) > 0


class NanNotes:
    """``nan_mentioned`` (once per run) and ``eval_nonfinite`` (once per attempt and metric)."""

    cause = Cause.NAN
    wants_metrics = True

    def __init__(self, *, text: bool, eval_fields_judged: bool, evidence_chars: int,
                 overflow_steps: int = 20) -> None:
        self.text = text
        self.overflow_steps = overflow_steps
        self.overflows = 0  # this attempt's skipped steps (grad_overflow: said at the 1st, 10th, 100th ...)
        self._next_overflow_note = 1
        # val_loss named in [detectors.nan] fields: the NanDetector rolls back on it, no warning here.
        self.eval_fields_judged = eval_fields_judged
        self.keywords: tuple[str, ...] = NAN_TEXT_KEYWORDS if text else ()
        self.evidence_chars = evidence_chars
        self.mentioned = False  # once per run: never cleared by reset
        self.eval_said: set[str] = set()
        self.eval_notices = 0
        self.last_train: tuple[int | None, float] | None = None  # (step, loss) of the last finite training loss
        self.pending: list[Notice] = []

    def reset(self, resume_step: int | None) -> None:
        self.eval_said.clear()
        self.eval_notices = 0
        self.overflows = 0
        self._next_overflow_note = 1

    def take(self) -> list[Notice]:
        out, self.pending = self.pending, []
        return out

    def observe(self, source: str, line: str, rec: MetricRecord | None, step: int | None) -> Detection | None:
        if rec is not None:
            if rec.loss is not None and math.isfinite(rec.loss) and not rec.extra.get("eval"):
                self.last_train = (rec.step if rec.step is not None else step, rec.loss)
            if overflow_skip(rec):
                self._overflow(source, line, rec, step)
            self._eval(source, line, rec, step)
            if has_nonfinite_value(rec):
                return None  # a value: the NanDetector's (or the eval warning's), not a mention
        if self.text and not self.mentioned:
            self._mention(source, line, step)
        return None

    def _eval(self, source: str, line: str, rec: MetricRecord, step: int | None) -> None:
        if _bad(rec.loss) or _bad(rec.grad_norm) or rec.extra.get(NAN_ITERATIONS, 0) > 0:
            return  # the training values are not finite: that is the NanDetector's rollback
        bad: dict[str, float] = {}
        if rec.val_loss is not None and _bad(rec.val_loss) and not self.eval_fields_judged:
            bad["val_loss"] = rec.val_loss
        for key, v in rec.extra.items():
            if _bad(v) and is_eval_key(key):
                bad[key] = v
        new = {k: v for k, v in bad.items() if k not in self.eval_said}
        if not new or self.eval_notices >= MAX_EVAL_NOTICES:
            return
        new = dict(list(new.items())[:MAX_EVAL_FIELDS])
        self.eval_said.update(new)
        self.eval_notices += 1
        at = rec.step if rec.step is not None else step
        self.pending.append(Notice("eval_nonfinite", Level.WARNING, eval_message(new, at, self.last_train), {
            "fields": {k: str(v) for k, v in new.items()}, "step": at, "source": source,
            "line": redact_line(line.rstrip(), limit=self.evidence_chars),
            "train_loss": None if self.last_train is None else self.last_train[1],
            "next": "not rolled back; the run goes on" + (
                f" (the last eval_nonfinite of this attempt: at most {MAX_EVAL_NOTICES})"
                if self.eval_notices >= MAX_EVAL_NOTICES else "")}))

    def _overflow(self, source: str, line: str, rec: MetricRecord, step: int | None) -> None:
        self.overflows += 1
        if self.overflows < self._next_overflow_note:
            return
        self._next_overflow_note *= 10  # a week of fp16 skips is a handful of warnings, not thousands
        at = rec.step if rec.step is not None else step
        where = f" at step {at}" if at is not None else ""
        self.pending.append(Notice("grad_overflow", Level.WARNING, (
            f"the grad norm is {rec.grad_norm}{where} while the loss is finite ({rec.loss:.4g}): a step the fp16 "
            f"loss scaler skipped (its gradients overflowed; it goes on with a smaller scale). {self.overflows} "
            f"such record(s) this attempt. Not rolled back: only {self.overflow_steps} in a row at a loss scale that no "
            "longer falls are ([detectors.nan] overflow_steps); a non-finite loss is at once"),
            {"line": redact_line(line.rstrip(), limit=self.evidence_chars), "source": source, "step": at,
             "overflows": self.overflows, "overflow_steps": self.overflow_steps,
             "next": f"the run goes on; said again at the {self._next_overflow_note}th skipped step of this attempt"}))

    def _mention(self, source: str, line: str, step: int | None) -> None:
        for rule in NAN_TEXT_RULES:
            if not any(a in line for a in rule.anchors):
                continue
            m = rule.pattern.search(line)
            if m is None or (rule.unless is not None and rule.unless(line, m)):
                continue
            self.mentioned = True
            where = f" at step {step}" if step is not None else ""
            self.pending.append(Notice("nan_mentioned", Level.WARNING, (
                f"a line of the job's output speaks of NaN/inf{where} ({rule.summary}), but no metric value in it "
                "is non-finite: the job is not stopped (a rollback needs a non-finite value in a metric: a parsed "
                "field, a metric file, the client). Said once per run. If this line does mean the run diverged, "
                "name it in [detectors.nan] patterns to roll back on it"),
                {"line": redact_line(line.rstrip(), limit=self.evidence_chars), "source": source, "step": step,
                 "rule": rule.summary, "next": "watching goes on; this warning is not repeated in this run"}))
            return


def eval_message(bad: Mapping[str, float], step: int | None, last_train: tuple[int | None, float] | None) -> str:
    """``eval_nonfinite``'s message: what is not finite, that training is, and what happens next."""
    what = ", ".join(f"{k} is {v}" for k, v in bad.items())
    where = f" at step {step}" if step is not None else ""
    train = (f"the training loss is finite ({last_train[1]:.4g} at step {last_train[0]})" if last_train is not None
             else "no training loss is non-finite")
    return (f"{what}{where}, an evaluation metric, while {train}: the evaluation looks broken (an empty or "
            "failing validation loader, a division by zero in the metric), not the model. Not rolled back: the "
            "run goes on. To roll back on a non-finite eval loss, add \"val_loss\" to [detectors.nan] fields")
