"""Which checkpoint a relaunch resumes from: the newest good one before the onset (a rollback)
or the newest good one (a restart), verified first, corrupt ones met on the way quarantined; with
``verify = "overlap"`` a restart may take the newest on its structural checks alone; with
``prefer = "best_val"`` a rollback passes over checkpoints with a worse recorded validation metric.

Functions over what they need of the ``CheckpointService`` (``ChoiceSource``: its lock, scan,
evaluation, book and keepers): the choice is one concern, the service the facade the runner and
the CLI call.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from contextlib import AbstractContextManager
from typing import Any, Protocol

import structlog

from ..core.causes import ACTIONS, Action
from .config import CheckpointsConfig
from .discovery import Candidate, Layout, newest_complete
from .layouts.registry import keeps_last_good
from .scancache import cached_refusal
from .quarantine import QuarantineRecord, preserve_last_good, quarantine, restore_last_good
from .quicklist import MetricsSeen, Readiness, is_corrupt, val_metric_for
from .loadtest import LoadTests
from .selection import CheckpointBook, Choice, Mode, select_explained, worse_than_older
from .snapshot import Headroom
from .structure import structure_problem

log = structlog.get_logger("supervisor.checkpoints")


@dataclass(frozen=True)
class Outcome:
    """A choice (None: none ready) and what it met on the way, for the ledger's events: the
    checkpoints moved to quarantine/ and those refused for unsafe pickles, (path, why)."""

    choice: Choice | None
    quarantined: tuple[QuarantineRecord, ...] = ()
    refused: tuple[tuple[str, str], ...] = ()


class ChoiceSource(Protocol):
    """What the choice reads of the service (the service is one; a protocol, not an import of
    it, since the service calls in here)."""

    @property
    def cfg(self) -> CheckpointsConfig: ...
    @property
    def dir(self) -> Path: ...
    @property
    def book(self) -> CheckpointBook: ...
    @property
    def headroom(self) -> Headroom: ...
    @property
    def load_tests(self) -> LoadTests: ...
    @property
    def _lock(self) -> AbstractContextManager[Any]: ...

    def scan(self) -> list[Candidate]: ...
    def structural(self, cand: Candidate) -> tuple[list[str], int | None, bool]: ...
    def evaluate(self, cand: Candidate, metrics_seen: MetricsSeen | None = None,
                 current: tuple[dict[str, Any], str | None] | None = None, *, finite: bool = False) -> Readiness: ...
    def _current_config(self) -> tuple[dict[str, Any], str | None]: ...
    def _manifest_of(self, path: Path) -> Any: ...


def action_mode(action: object) -> Mode:
    """The chooser's mode for an action (``ActionSpec.before_onset``); an unknown name restarts."""
    try:
        before_onset = ACTIONS[Action(str(action))].before_onset
    except ValueError:
        before_onset = False
    return "rollback" if before_onset else "restart"


def overlap_choice(svc: ChoiceSource) -> Outcome | None:
    """checkpoints.verify = "overlap": the newest checkpoint when its structural checks pass
    and its load test has not run yet (it then runs beside the job's start-up); None to let
    the full gate decide (nothing written, a structural failure, or already verified), or the
    newest refused (``Outcome.refused``, no choice) for an unsafe pickle."""
    with svc._lock:
        target = newest_complete(svc.scan())
        if target is None:
            return None
        problems, step, verified = svc.structural(target)
        if problems or verified:
            return None
        refusal = None if svc.cfg.trust_pickles else cached_refusal(target.path)  # scanned once a version
        unsafe = refusal.why if refusal is not None else None
        if unsafe:
            # Never handed to the job on its structural checks alone: the full gate below
            # load-tests it first (weights_only=True, which refuses pickled code) and picks the
            # next older good checkpoint if that fails. Not marked bad on the scan alone: the
            # allowlist is torch's default one, and a job may allow more types itself
            # (torch.serialization.add_safe_globals) that its own load accepts.
            log.warning("checkpoint_refused_unsafe_pickle", path=str(target.path), reason=unsafe,
                        next="not handed over before its load test; the full check runs before the launch")
            return Outcome(None, refused=((str(target.path), unsafe),))
        reason = (f"newest checkpoint (step {step if step is not None else '?'}): structural checks passed; "
                  "its load test runs beside the job's start-up (checkpoints.verify = \"overlap\")")
        log.info("checkpoint_chosen", path=str(target.path), step=step, mode="restart", reason=reason,
                 next="the job is launched now; should the load test fail, it is stopped and relaunched "
                      "from an older verified checkpoint")
        return Outcome(Choice(path=target.path, step=step, layout=str(target.layout), reason=reason,
                              verify_pending=True))


def choose_for_resume(svc: ChoiceSource, action: object, onset_step: int | None,
                      metrics_seen: MetricsSeen | None = None, *, overlap: bool = False) -> Choice | None:
    """:func:`choose`'s choice alone."""
    return choose(svc, action, onset_step, metrics_seen, overlap=overlap).choice


def choose(svc: ChoiceSource, action: object, onset_step: int | None,
           metrics_seen: MetricsSeen | None = None, *, overlap: bool = False) -> Outcome:
    """The checkpoint to relaunch from, verified now; corrupt or bad ones met on the way are
    quarantined (moved, never deleted) and the next older one is tried. ``overlap``: a restart
    may take the newest checkpoint on its structural checks alone (``Choice.verify_pending``);
    a rollback always verifies first (its finite check decides between candidates)."""
    mode = action_mode(action)
    refused: tuple[tuple[str, str], ...] = ()
    if overlap and mode == "restart" and svc.cfg.load_test:
        early = overlap_choice(svc)
        if early is not None and early.choice is not None:
            return early
        refused = early.refused if early is not None else ()
    with svc._lock:
        current = svc._current_config()
        limit = onset_step - svc.cfg.margin_steps if mode == "rollback" and onset_step is not None else None
        rows: list[Readiness] = []
        quarantined: list[QuarantineRecord] = []
        cands = svc.scan()
        worse = worse_val(svc, cands, limit, metrics_seen) if mode == "rollback" else None
        for cand in cands:
            if limit is not None and cand.step is not None and cand.step >= limit:
                continue  # after the anomaly began: not a rollback target, no need to verify it
            row = svc.evaluate(cand, metrics_seen, current, finite=mode == "rollback")
            if not row.ready and svc.cfg.quarantine and is_corrupt(row):
                try:
                    quarantined.append(quarantine(row.path, "; ".join(row.reasons), row.layout))
                except OSError as exc:
                    log.error("checkpoint_quarantine_failed", path=str(row.path), error=str(exc),
                              next="marked bad instead; it stays where it is")
                    svc.book.mark_bad(row.path, "; ".join(row.reasons))
                continue
            rows.append(row)
            choice, _ = select_explained(rows, mode=mode, onset_step=onset_step,
                                         margin_steps=svc.cfg.margin_steps, bad=svc.book.bad_paths(),
                                         worse=worse)
            if choice is not None:
                choice = finish_choice(svc, choice)
                quarantined.extend(choice.quarantined)
                choice = replace(choice, quarantined=tuple(quarantined))
                log.info("checkpoint_chosen", path=str(choice.path), step=choice.step, mode=mode,
                         reason=choice.reason, quarantined=[str(q.source) for q in quarantined],
                         next="the job is relaunched from it")
                return Outcome(choice, tuple(quarantined), refused)
        _, reason = select_explained(rows, mode=mode, onset_step=onset_step,
                                     margin_steps=svc.cfg.margin_steps, bad=svc.book.bad_paths(), worse=worse)
        log.warning("checkpoint_none_ready", mode=mode, onset_step=onset_step, reason=reason,
                    quarantined=[str(q.source) for q in quarantined],
                    next="the policy decides: a fresh start or give up")
        return Outcome(None, tuple(quarantined), refused)


def worse_val(svc: ChoiceSource, cands: list[Candidate], limit: int | None,
              metrics_seen: MetricsSeen | None) -> dict[Path, str] | None:
    """``prefer = "best_val"``: the rollback candidates to pass over for a better recorded
    validation metric further back, from the manifests and the log (no load test)."""
    if svc.cfg.prefer != "best_val":
        return None
    vals: list[tuple[Path, int | None, float | None]] = []
    for c in cands:
        if limit is not None and c.step is not None and c.step >= limit:
            continue
        manifest = svc._manifest_of(c.path).manifest
        vm = val_metric_for(c.step, svc.cfg.val_metric, manifest.metrics if manifest else None, metrics_seen)
        vals.append((c.path, c.step, vm.value if vm else None))
    return worse_than_older(vals, tolerance=svc.cfg.prefer_tolerance,
                            higher_is_better=svc.cfg.val_higher_is_better)

def finish_choice(svc: ChoiceSource, choice: Choice) -> Choice:
    """Keep a copy of a single overwritten checkpoint; put a last_good copy back in place."""
    if keeps_last_good(choice.layout) and svc.cfg.preserve_last_good:
        try:
            preserve_last_good(choice.path, max_bytes=svc.cfg.last_good_max_bytes, headroom=svc.headroom)
        except OSError as exc:
            log.warning("checkpoint_preserve_failed", path=str(choice.path), error=str(exc),
                        next="resuming anyway; a bad overwrite could destroy this state")
    if choice.layout == str(Layout.LAST_GOOD):
        original = svc.dir / choice.path.name
        if original.exists():
            # The job overwrote it with something that did not pass (else it would have been
            # chosen, being at least as new): move it aside so the good copy can go back. The
            # structural check first: a truncated file is known bad in microseconds, without
            # a load test on the restart path.
            problem = structure_problem(original)
            if problem is None:
                row = svc.evaluate(Candidate(original, None, Layout.SINGLE, 0.0, 0))
                problem = None if row.ready else "; ".join(row.reasons)
            if problem is not None:
                rec = quarantine(original, f"overwritten with a checkpoint that is not ready ({problem}); "
                                 "the last good copy is restored", Layout.SINGLE)
                choice = replace(choice, quarantined=choice.quarantined + (rec,))
        if not original.exists():
            # The original was moved to quarantine/, so nothing is overwritten.
            restore_last_good(choice.path, original)
            svc.load_tests.carry(choice.path, original)
            return replace(choice, path=original, reason=choice.reason + " (restored from last_good/)")
    return choice
