"""The checkpoint store port and its concern: verify, quarantine and choose where an attempt
resumes from (on the launch-preparation thread), book each attempt against its checkpoint, and
verify new saves on threads of their own while the job runs. With no checkpoint dir configured
every resume is a fresh start."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence, TypeVar

import structlog

from ..config.model import Config
from ..core.messages import EndAttempt, Resume
from ..core.runend import EndFacts
from ..events import Action, AttemptContext, Cause
from ..core.observations import Detection, MetricRecord
from .effects import AttemptField
from .ports import Concern, DaemonView

if TYPE_CHECKING:  # imported where used: a daemon without a checkpoint dir never loads them
    from ..checkpoints.discovery import Candidate
    from ..checkpoints.service import CheckpointService
    from ..job.cgroup import VerifierCgroup

log = structlog.get_logger("supervisor.daemon")

# A checkpoint version as the verifier tells them apart: (path, mtime, size).
VersionKey = tuple[str, float, int]
_M = TypeVar("_M")


def newest_checkpoint(svc: CheckpointService) -> Candidate | None:
    """The newest complete checkpoint by a fresh discovery scan: its own short lock, never the
    service's, which a load test on the preparation thread may hold for seconds."""
    from ..checkpoints.discovery import newest_complete

    return newest_complete(svc.discovery.scan())


def _key(c: Candidate | None) -> VersionKey | None:
    return None if c is None else (str(c.path), c.mtime, c.size)


@dataclass(frozen=True)
class EndedFrom:
    """A counted attempt's end as the booking needs it, from the main loop (``attempt_ended``) to
    the launch-preparation thread (``book_last_attempt``)."""

    checkpoint: str | None  # what it resumed from
    cause: str
    newer: bool  # a newer complete checkpoint appeared while it ran
    step: int | None  # the step it resumed from


@dataclass(frozen=True)
class VerifyBesideStart:
    """A checkpoint chosen with its load test still to run (verify = "overlap"), from the
    preparation thread (``choose``) to the main loop (``attempt_started``)."""

    path: Path
    layout: str


def _take_all(q: queue.SimpleQueue[_M]) -> list[_M]:
    out: list[_M] = []
    while True:
        try:
            out.append(q.get_nowait())
        except queue.Empty:
            return out


def remedy_keys(cfg: Config) -> list[str]:
    """Launch-arg keys that remedies change: the checkpoint config diff allows them."""
    keys: list[str] = []
    for oc in cfg.on.values():
        for rem in oc.remedies:
            for a in rem.args:
                if a.startswith("-"):
                    keys.append(a.split("=", 1)[0].lstrip("-"))
            keys += list(rem.env)
    return keys


class CheckpointConcern(Concern):
    """The checkpoint store (verify, quarantine, choose) and its bookkeeping per attempt; with
    no checkpoint dir configured every resume is a fresh start."""

    name = "checkpoints"

    def __init__(self) -> None:
        self.svc: CheckpointService | None = None  # once started, when a checkpoint dir is configured
        self.daemon: DaemonView | None = None
        self.takes_checkpoint: Callable[[], bool] = lambda: True  # the discovery's answer (ckptdiscovery.py)
        self._newest_at_launch: VersionKey | None = None
        # Between the main loop and the preparation thread, only frozen messages: the ends to book,
        # and the choice whose load test runs beside the start (each way one queue).
        self._to_book: queue.SimpleQueue[EndedFrom] = queue.SimpleQueue()
        self._to_verify: queue.SimpleQueue[VerifyBesideStart] = queue.SimpleQueue()
        self._newest_cache: Candidate | None = None
        self._newest_at = float("-inf")
        self._scan_every_s = 5.0  # from the settle window once started
        self._verified_key: VersionKey | None = None
        self._verifier: threading.Thread | None = None
        self._verifier_cgroup: VerifierCgroup | None = None  # the load tests' low-weight cgroup

    def start(self, daemon: DaemonView) -> None:
        self.daemon = daemon
        cfg = daemon.cfg
        # A save is seen settled within settle_s of its last write; looking only every 5 s left
        # it unverified for up to 5 s more (a save every few seconds was then rarely verified
        # before the next one overwrote it). A scan is a glob and a few stats.
        self._scan_every_s = min(5.0, max(0.5, cfg.checkpoints.settle_s))
        self.adopt(cfg)

    def adopt(self, cfg: Config, *, replace: bool = False) -> None:
        """Open the checkpoint service on ``cfg``'s checkpoint dir (at start, or later when the
        dir was found while the job ran: supervisor.daemon.ckptdiscovery); ``replace``: a found
        dir the job has moved on from (Lightning's version_N/checkpoints of each new run)."""
        d = cfg.checkpoint_dir()
        if d is None or self.daemon is None:
            return
        # Only with a checkpoint dir: its imports are not on a dir-less daemon's way to the first launch.
        from ..checkpoints.service import CheckpointService

        if self.svc is not None:
            if not replace or self.svc.dir == d:
                return
            old, self.svc = self.svc, None
            old.close()  # its load tests under way stop; their verifier threads end with LoadTestCancelled
            self._verified_key = self._newest_cache = None
            _take_all(self._to_verify)  # a choice in the old dir: no load test of it beside the start
        d.mkdir(parents=True, exist_ok=True)
        if self._verifier_cgroup is None and cfg.job.cgroup:  # the job has a cgroup: its verifier one beside it
            from ..job.cgroup import VerifierCgroup

            self._verifier_cgroup = VerifierCgroup()
        self.svc = CheckpointService(cfg.checkpoints, d, self.daemon.state_dir, cfg.job.python,
                                     list(cfg.job.command), cfg.workdir(), remedy_keys=remedy_keys(cfg),
                                     verifier_cgroup=self._verifier_cgroup)
        self._newest_at = float("-inf")
        if self.svc.write_manifests:  # files of ours in the user's folder: said once per folder, before any
            self.daemon.event(
                "checkpoint_manifests_on", "info",
                f"a checkpoint in {d} that comes without a manifest gets one from the supervisor beside it "
                "(<checkpoint>.manifest.json: its digest, step, config and validation metric, read to verify it "
                "before a resume; also in last_good/); the checkpoints themselves are never changed. To write "
                "none: [checkpoints] write_manifests = false (wrap --set checkpoints.write_manifests=false); "
                "checkpoints without a manifest of their own are then not checked for integrity",
                path=str(d))

    # -- the port -------------------------------------------------------------------------
    def book_last_attempt(self) -> str | None:
        """On the preparation thread: book the last attempt's result against its checkpoint
        (a checkpoint failed from twice is marked bad); a reason to give up on no progress."""
        ended = _take_all(self._to_book)
        if self.svc is None or not ended:
            return None
        assert self.daemon is not None
        for e in ended:  # one per attempt ended since the last preparation (one, in practice)
            if self.svc.note_attempt_result(e.checkpoint, e.cause, e.newer, step=e.step):
                self.daemon.event("checkpoint_marked_bad", "warning",
                                  f"checkpoint {e.checkpoint} is marked bad: the job failed from it ({e.cause}) "
                                  "without producing a newer one; the next resume uses an older ready checkpoint",
                                  path=e.checkpoint, cause=e.cause)
        if not self.svc.no_progress():
            return None
        return (f"no progress: {self.svc.attempts_without_progress()} attempts in a row failed without a newer "
                f"checkpoint (steps resumed from: {self.svc.steps_seen()}; "
                f"checkpoints.no_progress_attempts = {self.daemon.cfg.checkpoints.no_progress_attempts})")

    def choose(self, cfg: Config, action: Action, onset_step: int | None, explicit: str | None,
               metrics: Sequence[MetricRecord]) -> Resume:
        """On the preparation thread: verify, quarantine, choose (seconds); whether the job is
        known to take the choice (``takes_checkpoint``, set by the checkpoint discovery)."""
        resume = self._choose(cfg, action, onset_step, explicit, metrics)
        return replace(resume, handed=False) if resume.checkpoint and not self.takes_checkpoint() else resume

    def _choose(self, cfg: Config, action: Action, onset_step: int | None, explicit: str | None,
                metrics: Sequence[MetricRecord]) -> Resume:
        if explicit:
            return Resume(explicit, None, "the operator's choice (restart --from)")
        if self.svc is None:
            return Resume(None, None, "no checkpoint dir configured or found")
        from ..checkpoints.quicklist import metrics_from_records

        assert self.daemon is not None
        svc, event = self.svc, self.daemon.event
        svc.set_writer_active(False)  # the previous attempt's group is gone
        overlap = cfg.checkpoints.verify == "overlap"
        if not overlap:  # with overlap, the version chosen is kept once its load test passes
            svc.preserve_single_checkpoints()
        outcome = svc.choose(action, onset_step, metrics_from_records(list(metrics)), overlap=overlap)
        choice = outcome.choice
        _take_all(self._to_verify)  # a choice whose attempt never started (its spawn failed) is stale
        if choice is not None and choice.verify_pending:
            self._to_verify.put(VerifyBesideStart(choice.path, choice.layout))
        for path, why in outcome.refused:
            event("checkpoint_refused_unsafe_pickle", "warning",
                  f"checkpoint {path} was not handed to the job on its structural checks: {why}; it was "
                  "load-tested first (weights_only), and an older verified checkpoint is used if that fails",
                  path=path, reason=why)
        for q in outcome.quarantined:
            event("checkpoint_quarantined", "warning",  # the service logged it; keep it in the ledger
                  f"checkpoint {q.source} is bad ({q.reason}); moved to {q.dest} (never deleted)",
                  ledger_only=True, source=str(q.source), dest=str(q.dest), reason=q.reason)
        self._newest_at_launch = _key(newest_checkpoint(svc))
        if choice is None:
            return Resume(None, None, "no ready checkpoint: " + ("every candidate failed the quicklist"
                                                                 if svc.scan() else "none written yet"))
        rd = choice.readiness.to_json() if choice.readiness is not None else None
        event("checkpoint_chosen", "info", f"resuming from {choice.path} (step {choice.step}): {choice.reason}"
              + (f"; passed over {len(choice.skipped)} newer" if choice.skipped else ""), ledger_only=True,
              path=str(choice.path), step=choice.step, skipped=[list(x) for x in choice.skipped] or None, readiness=rd)
        return Resume(str(choice.path), choice.step, choice.reason)

    def ready_steps(self) -> dict[int, str]:
        svc = self.svc
        if svc is None:
            return {}
        svc.set_writer_active(False)  # the previous attempt's group is gone
        return {int(r.step): str(r.path) for r in reversed(svc.quicklist()) if r.ready and not r.bad and r.step is not None}

    def emergency_checkpoint_probe(self) -> Callable[[], bool] | None:
        if self.svc is None:  # no checkpoint dir configured: nothing to wait for
            return None
        before = _key(newest_checkpoint(self.svc))

        def probe() -> bool:
            # A new complete checkpoint (not a temp file, settled) is the emergency one (in the
            # service of now: a found dir the job moved to may have replaced it).
            svc = self.svc
            key = _key(newest_checkpoint(svc)) if svc is not None else None
            return key is not None and key != before

        return probe

    # -- the concern ----------------------------------------------------------------------
    def attempt_started(self, ctx: AttemptContext, resume: Resume, wall: float) -> None:
        if self.svc is not None:
            self.svc.set_writer_active(True)
        pending = [p for p in _take_all(self._to_verify) if str(p.path) == resume.checkpoint]
        if self.svc is not None and pending:
            self._verify_beside_start(pending[-1].path, pending[-1].layout, ctx.attempt)

    def _verify_beside_start(self, path: Path, layout: str, attempt: int) -> None:
        """checkpoints.verify = "overlap": the load test of the checkpoint the job resumes from runs
        now, beside the job's own start-up; a failure stops the job (a checkpoint_load_error) and
        the next attempt resumes from an older verified checkpoint."""
        svc, daemon = self.svc, self.daemon
        assert svc is not None and daemon is not None
        self._verified_key = _key(newest_checkpoint(svc))  # the tick must not start a second load test of it
        from ..checkpoints.loadtest import version_token

        launched = version_token(path)  # the version the job was handed, before it can save again

        def verify() -> None:
            from ..checkpoints.loadtest import LoadTestCancelled

            try:
                row = svc.verify_chosen(path, layout)
            except LoadTestCancelled:
                return  # the daemon is exiting; close() said so
            except Exception as e:
                log.warning("checkpoint_verify_after_launch_failed", path=str(path), error=repr(e),
                            message="could not verify the checkpoint the job resumed from; the job keeps running")
                return
            finally:
                self._book_not_kept()
            if daemon.attempt != attempt:
                return  # that attempt is over; the next choice sees the cached result
            if row.ready:
                daemon.event("checkpoint_verified_after_launch", "info",
                             f"{path} passed its load test beside the job's start-up (step {row.step})",
                             path=str(path), step=row.step)
                # The step the load test read (nanoGPT's iter_num) is the resume step only if it read
                # the version the job was handed: a single overwritten file the job saved over first
                # (a loaded machine) gives a later step, and the resume step then stays unknown.
                if row.step is not None and version_token(path) == launched:
                    daemon.apply(AttemptField(attempt, resume_step=row.step))  # a message to the loop
                return
            if version_token(path) != launched:
                # A single overwritten file (nanoGPT's ckpt.pt) that the resumed job has already
                # saved over: the version it was handed is gone, so this test read another one, or
                # a save half-written. The job loaded its version itself and trains on; stopping it
                # would throw that work away. The new version is verified like any save.
                daemon.event("checkpoint_superseded_before_verified", "info",
                             f"the job saved over {path} before the load test of the version it resumed from "
                             "ended; the job loaded that version itself and keeps running, and its new save "
                             "is verified in the background", path=str(path))
                self._verified_key = None
                return
            why = "; ".join(row.reasons) or "not ready"
            daemon.emit(Detection(Cause.CHECKPOINT_LOAD_ERROR,
                                  f"the checkpoint attempt {attempt} resumes from, {path}, failed verification: {why}",
                                  "checkpoint-verify", step=row.step, evidence=why[:400],
                                  details={"path": str(path)}, at=time.time()))

        self._verifier = threading.Thread(target=verify, name="checkpoint-verify-launch", daemon=True)
        self._verifier.start()

    def attempt_ended(self, end: EndAttempt, resume: Resume, wall: float) -> None:
        if self.svc is None or not end.spawned or end.cause is None or not end.counted:
            return
        # Only noted here: the service's bookkeeping takes its lock, which a background load test
        # may hold for seconds, so it happens on the launch-preparation thread (book_last_attempt).
        self.svc.set_writer_active(False)  # the attempt's group is gone: nothing still writes
        newer = _key(newest_checkpoint(self.svc)) != self._newest_at_launch
        self._to_book.put(EndedFrom(resume.checkpoint, end.cause.value, newer, resume.step))

    def tick(self, now: float) -> None:
        """A checkpoint that appeared while the job runs is verified on a thread of its own."""
        # A save not kept is booked as soon as it is reported, on this loop: the verifier thread
        # that reported it may spend many seconds on the load test that follows, and a run that
        # ends meanwhile would otherwise lose the event (CI: 15 saves not kept, none in history).
        self._book_not_kept()
        d = self.daemon
        if self.svc is None or d is None or not d.cfg.checkpoints.verify_in_background or not d.run_view().has_job:
            return
        newest = self.newest()
        key = _key(newest)
        if key is None or key == self._verified_key or (self._verifier and self._verifier.is_alive()):
            return
        self._verified_key = key
        svc = self.svc
        from ..checkpoints.quicklist import metrics_from_records

        # Taken here, on the main loop that appends to the history: the validation metrics the log
        # printed, for the new version's manifest.
        seen = metrics_from_records([r for r in d.metric_history if r.val_loss is not None or r.extra])

        def verify() -> None:
            from ..checkpoints.loadtest import LoadTestCancelled

            try:
                row = svc.verify_newest(seen)
            except LoadTestCancelled:
                return  # the daemon is exiting; close() said so
            except Exception as e:
                log.warning("checkpoint_background_verify_failed", error=repr(e))
                return
            finally:
                self._book_not_kept()
            if row is not None and not row.ready:
                log.warning("checkpoint_not_ready", path=str(row.path), reasons=list(row.reasons),
                            message=f"the newest checkpoint {row.path} fails the readiness quicklist: "
                                    f"{'; '.join(row.reasons)}; a restart would use an older one")

        self._verifier = threading.Thread(target=verify, name="checkpoint-verify", daemon=True)
        self._verifier.start()

    def _book_not_kept(self) -> None:
        """Each save the service could not keep (no room for a copy, a failed copy) is an event:
        never silence (the service logged it already)."""
        if self.svc is None or self.daemon is None:
            return
        for path, why in self.svc.take_not_kept():
            self.daemon.event("checkpoint_not_kept", "warning",
                              f"the save {path} could not be kept in last_good/: {why}; the job's save "
                              "stands, and a bad overwrite of it falls back to the last kept version",
                              ledger_only=True, path=path, reason=why)

    def end_facts(self, facts: EndFacts, keepalive: Callable[[], bool]) -> EndFacts:
        """The newest checkpoint's weights checked finite (the rollback's check), the job being gone."""
        if self.svc is None:
            return facts  # no checkpoint dir known: the facts say so
        from .endweights import check_newest_weights

        return replace(facts, weights=check_newest_weights(self.svc, keepalive))

    def close(self) -> None:
        if self.svc is None or self.daemon is None:
            return
        cancelled = self.svc.close()
        self._book_not_kept()  # reported by a verifier since the last tick
        for path in cancelled:
            self.daemon.event("checkpoint_load_test_cancelled", "info",
                              f"the load test of {path} was stopped unfinished: the supervisor is exiting "
                              "(no verdict on the checkpoint; a later start tests it again)", path=path)

    def newest(self) -> Candidate | None:
        """The newest complete checkpoint, looked up at most every settle window (0.5-5 s): the
        background verifier, status, the host monitor's disk check."""
        if self.svc is None:
            return None
        now = time.monotonic()
        if now - self._newest_at >= self._scan_every_s:
            self._newest_at = now
            self._newest_cache = newest_checkpoint(self.svc)
        return self._newest_cache

    def newest_bytes(self) -> int | None:
        """The size of the newest complete checkpoint (the host monitor's disk check: room for one more)."""
        newest = self.newest()
        return newest.size if newest is not None else None

    def status(self) -> dict[str, Any]:
        if self.svc is None:
            return {}
        out: dict[str, Any] = {}
        newest = self.newest()
        if newest is not None:
            out["newest_checkpoint"] = str(newest.path)
            out["seconds_since_last_good_checkpoint"] = round(max(0.0, time.time() - newest.mtime), 1)
        # A version not kept is shown even before any good one exists: that is when it matters most.
        lg = self.svc.last_good_disk_bytes()  # a scandir and a few stats
        if lg is not None:
            out["last_good_disk_bytes"] = lg
        out.update(self.live_status())
        return out

    def live_status(self) -> dict[str, Any]:
        nk = self.svc.last_not_kept if self.svc is not None else None  # set by a verifier thread
        if nk is None:
            return {}
        return {"checkpoint_not_kept": f"{nk[0]}: {nk[1]} ({round(max(0.0, time.time() - nk[2]))} s ago)"}
