"""Post-reboot validation: do the first steps after a resume look like the run before it?

The seed's checklist after a restart: the model loads and batches flow (a first step arrives
before a deadline, in a time comparable to earlier starts); the initial loss is comparable to the
loss recorded at the resumed step (the rolled-back step, not the pre-failure loss); the gradient
norm stays inside its prior distribution; throughput is within a tolerance of the baseline.
Each check passes, fails, or is skipped with the reason (no baseline yet); a failure becomes
``validation_failed``, whose default action rolls back to the previous ready checkpoint and
relaunches with diagnostics switched on.

Pure: the runner feeds metric records and the clock; the validator never acts.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Sequence

from .settings import ValidationConfig
from .observations import MetricRecord
from .resumecheck import CHECK_NAME, RULE, resume_ignored


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool | None  # None: skipped (no baseline)
    value: float | None
    reference: float | None
    limit: str
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "value": self.value, "reference": self.reference, "limit": self.limit,
                "note": self.note}


@dataclass(frozen=True)
class Verdict:
    passed: bool
    checks: tuple[Check, ...]
    steps_seen: int
    resume_step: int | None
    summary: str
    records: int | None = None  # metric records judged (fewer than steps_seen when the job prints every N steps)

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "verdict": "pass" if self.passed else "fail", "summary": self.summary,
                "steps": self.steps_seen, "records": self.records, "resume_step": self.resume_step,
                "checks": {c.name: c.to_json() for c in self.checks}}


@dataclass(frozen=True)
class Baseline:
    """What the run looked like before the reboot (from the earlier attempts' metrics)."""

    loss_at_resume: float | None  # median loss of the records in the window up to the resume step
    loss_spread: float | None  # their robust standard deviation (1.4826 x MAD): per-batch noise
    grad_norm_p99: float | None
    throughput_median: float | None
    startup_median_s: float | None  # earlier attempts: launch -> first step

    @staticmethod
    def from_history(records: Sequence[MetricRecord], resume_step: int | None,
                     startups: Sequence[float], window: int = 20) -> "Baseline":
        by_step: dict[int, MetricRecord] = {}
        for r in records:
            if r.step is not None and r.loss is not None:
                by_step[r.step] = r  # the latest record of a step wins (re-run steps after rollbacks)
        loss_ref = spread = None
        if resume_step is not None:
            near = [x for s in sorted(by_step) if resume_step - window < s <= resume_step
                    if (x := by_step[s].loss) is not None and x == x and abs(x) != float("inf")]
            if near:
                loss_ref = statistics.median(near)
                spread = 1.4826 * statistics.median(abs(x - loss_ref) for x in near)
        gn = sorted(r.grad_norm for r in records if r.grad_norm is not None and r.grad_norm == r.grad_norm
                    and r.grad_norm != float("inf"))
        p99 = gn[min(len(gn) - 1, int(0.99 * len(gn)))] if len(gn) >= 10 else None
        tp = [r.tokens_per_sec for r in records if r.tokens_per_sec is not None and r.tokens_per_sec > 0]
        return Baseline(loss_ref, spread, p99, statistics.median(tp) if len(tp) >= 5 else None,
                        statistics.median(startups) if startups else None)


@dataclass
class Validator:
    cfg: ValidationConfig
    baseline: Baseline
    resume_step: int | None
    started_at: float  # monotonic launch time of the attempt
    first_step_at: float | None = None
    seen: dict[int, MetricRecord] = field(default_factory=dict)
    verdict: Verdict | None = None
    first_step: int | None = None  # the first step reported after the resume, whatever it is

    def feed(self, records: Sequence[MetricRecord], now: float) -> Verdict | None:
        if self.verdict is not None:
            return None
        for r in records:
            if self.first_step is None and r.step is not None:
                self.first_step = r.step
                if (ignored := resume_ignored(self.resume_step, r.step)) is not None:
                    # The steps below the resume step would be skipped and the window would pass
                    # on the re-run steps past it: the verdict must say the resume did not happen.
                    c = Check(CHECK_NAME, False, r.step, self.resume_step, RULE, ignored.message)
                    self.verdict = Verdict(False, (c,), 0, self.resume_step, f"failed: resume_ignored: {ignored.message}")
                    return self.verdict
            if r.step is None or (self.resume_step is not None and r.step <= self.resume_step):
                continue
            if self.first_step_at is None:
                self.first_step_at = now
            prev = self.seen.get(r.step)
            self.seen[r.step] = _merge(prev, r) if prev else r
        if self.seen and self.steps_covered() >= self.cfg.steps:
            self.verdict = self._judge(now)
            return self.verdict
        return None

    def window_start(self) -> int | None:
        """The step the window counts from: the resume step, or (resume step unknown) the step
        before the first one seen."""
        if self.resume_step is not None:
            return self.resume_step
        return min(self.seen) - 1 if self.seen else None

    def steps_covered(self) -> int:
        """Training steps of the window done so far: the newest step seen minus the window's start.
        Counted in steps, not records, so a job that prints every 10 steps finishes a 20-step window
        at its second print, not at its twentieth (step 200)."""
        start = self.window_start()
        # No step seen yet (the attempt ended at its start-up): nothing covered, whatever the start.
        return 0 if start is None or not self.seen else max(self.seen) - start

    def poll(self, now: float) -> Verdict | None:
        """The first-step deadline: no step at all within first_step_timeout_s fails validation."""
        if self.verdict is None and self.first_step_at is None and now - self.started_at > self.cfg.first_step_timeout_s:
            c = Check("first_step", False, round(now - self.started_at, 3), self.cfg.first_step_timeout_s,
                      f"<= {self.cfg.first_step_timeout_s:g} s", "no training step after the resume")
            self.verdict = Verdict(False, (c,), 0, self.resume_step,
                                   f"no step within {self.cfg.first_step_timeout_s:g} s of the relaunch")
            return self.verdict
        return None

    def incomplete(self) -> dict[str, Any]:
        done = self.steps_covered()
        return {"passed": None, "verdict": "incomplete", "steps": done, "records": len(self.seen),
                "resume_step": self.resume_step,
                "summary": f"the attempt ended after {done} of {self.cfg.steps} validation steps"
                           f" ({len(self.seen)} metric records)"}

    def _judge(self, now: float) -> Verdict:
        cfg, b = self.cfg, self.baseline
        # The records inside the window (a batch may run past its end); at least the first one, for
        # a job that prints less often than the window is long.
        start = self.window_start()
        end = (start if start is not None else 0) + cfg.steps
        ordered = [self.seen[s] for s in sorted(self.seen)]
        recs = [r for r in ordered if r.step is not None and r.step <= end] or ordered[:1]
        covered = min(self.steps_covered(), cfg.steps)
        checks: list[Check] = []
        losses = [r.loss for r in recs if r.loss is not None]
        if losses and b.loss_at_resume is not None and b.loss_at_resume != 0:
            # Medians of equal windows before and after the resume, so per-batch noise cancels;
            # one-sided, because a wrong resume (fresh optimizer, wrong LR, wrong weights) makes
            # the loss worse, while a loss that keeps falling is training as usual. The limit
            # widens by the median's own uncertainty (3 standard errors of the pre-window noise).
            first = statistics.median(losses)
            se = 1.2533 * (b.loss_spread or 0.0) / max(1.0, len(losses)) ** 0.5
            limit = b.loss_at_resume + abs(b.loss_at_resume) * cfg.loss_tolerance + 3 * se
            rel = (first - b.loss_at_resume) / abs(b.loss_at_resume)
            ok = first == first and first <= limit
            checks.append(Check("initial_loss", ok, round(first, 6), round(b.loss_at_resume, 6),
                                f"<= {limit:.4g} (+{cfg.loss_tolerance:.0%} and 3 s.e. of the noise)",
                                f"{rel:+.1%}"))
        else:
            checks.append(Check("initial_loss", None, statistics.median(losses) if losses else None, b.loss_at_resume, "",
                                "no loss recorded near the resumed step" if losses else "no loss reported"))
        gns = [r.grad_norm for r in recs if r.grad_norm is not None]
        if gns and b.grad_norm_p99 is not None:
            worst = max(gns)
            lim = b.grad_norm_p99 * cfg.grad_norm_factor
            checks.append(Check("grad_norm", worst <= lim and worst == worst, round(worst, 6),
                                round(b.grad_norm_p99, 6), f"<= p99 x {cfg.grad_norm_factor:g} = {lim:.4g}"))
        else:
            checks.append(Check("grad_norm", None, max(gns) if gns else None, b.grad_norm_p99, "",
                                "no pre-reboot grad norm distribution" if gns else "no grad norm reported"))
        tps = [r.tokens_per_sec for r in recs if r.tokens_per_sec is not None]
        if len(tps) >= 3 and b.throughput_median:
            med = statistics.median(tps)
            lo = b.throughput_median * (1 - cfg.throughput_tolerance)
            checks.append(Check("throughput", med >= lo, round(med, 3), round(b.throughput_median, 3),
                                f">= {1 - cfg.throughput_tolerance:.0%} of baseline = {lo:.4g}"))
        else:
            checks.append(Check("throughput", None, None, b.throughput_median, "",
                                "no throughput baseline" if tps else "no throughput reported"))
        if self.first_step_at is not None:
            startup = self.first_step_at - self.started_at
            if b.startup_median_s:
                lim_s = max(b.startup_median_s * cfg.startup_factor, 1.0)
                checks.append(Check("startup", startup <= lim_s, round(startup, 3), round(b.startup_median_s, 3),
                                    f"<= {cfg.startup_factor:g} x earlier starts = {lim_s:.3g} s",
                                    "launch -> first step (includes the checkpoint load)"))
            else:
                checks.append(Check("startup", None, round(startup, 3), None, "", "no earlier start to compare"))
        failed = [c for c in checks if c.passed is False]
        if failed:
            summary = "failed: " + "; ".join(f"{c.name} {c.value} vs {c.reference} ({c.limit}, {c.note})".rstrip(", ()")
                                             for c in failed)
        else:
            ran = [c.name for c in checks if c.passed]
            summary = (f"passed over {covered} steps ({len(recs)} metric records)"
                       + (f" ({', '.join(ran)})" if ran else " (no baseline to compare)"))
        return Verdict(not failed, tuple(checks), covered, self.resume_step, summary, len(recs))


def _merge(a: MetricRecord, b: MetricRecord) -> MetricRecord:
    """Two records of one step (stdout line and client report): keep every value either has."""
    vals: dict[str, Any] = {}
    for k in ("loss", "grad_norm", "lr", "tokens_per_sec", "val_loss"):
        vals[k] = getattr(b, k) if getattr(b, k) is not None else getattr(a, k)
    return MetricRecord(step=b.step, rank=b.rank, source=b.source, fmt=b.fmt, at=b.at,
                        extra={**dict(a.extra), **dict(b.extra)}, **vals)

