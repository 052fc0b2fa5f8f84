"""The checkpoints while the job runs, a plug-in: each attempt booked against the checkpoint it
resumed from (the booking itself on the preparation thread, by the store), new saves verified on
a thread of their own, the checkpoint chosen with verify = "overlap" load-tested beside the job's
start-up, saves not kept said, the newest checkpoint in ``status``, its weights checked finite at
a clean end. Checkpoint I/O is the store's (:class:`~supervisor.daemon.checkpointstore.CheckpointStorePort`);
what the verifier threads find is turned into effects by the plain functions below and handed to
the runner's inbox (``DaemonStarted.hand``); the plug-in holds neither the daemon nor another plug-in."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import structlog

from ..core.causes import Cause
from ..core.observations import Detection, MetricRecord
from ..core.runend import EndFacts
from ..eventnames import EventName
from ..levels import Level
from .checkpointstore import CheckpointStorePort, VersionKey, version_key
from .effects import AttemptField, Detect, Effect, Note
from .metricbuffer import HISTORY_RECORDS
from .plugin import (AttemptEnded, AttemptStarted, Closes, DaemonStarted, Effects, GivesEndFacts, GivesLiveStatus,
                     GivesStatus, MetricsBatch, OnAttempts, OnMetrics, OnStart, OnTicks, RunView, Tick)

if TYPE_CHECKING:
    from ..checkpoints.quicklist import Readiness

log = structlog.get_logger("supervisor.daemon")


def not_kept_notes(not_kept: Sequence[tuple[str, str]]) -> list[Effect]:
    """Each save the service could not keep (no room for a copy, a failed copy) is an event:
    never silence (the service logged it already)."""
    return [Note(EventName.CHECKPOINT_NOT_KEPT, Level.WARNING,
                 f"the save {path} could not be kept in last_good/: {why}; the job's save stands, and a bad "
                 "overwrite of it falls back to the last kept version", {"path": path, "reason": why}, ledger_only=True)
            for path, why in not_kept]


def launch_check(row: Readiness, path: Path, attempt: int, *, same_version: bool, wall: float) -> list[Effect]:
    """What the load test beside the start of ``attempt`` found: ``same_version``, whether the
    file is still the version the job was handed; ``wall``: the time of the verdict."""
    if row.ready:
        out: list[Effect] = [Note(EventName.CHECKPOINT_VERIFIED_AFTER_LAUNCH, Level.INFO,
                                  f"{path} passed its load test beside the job's start-up (step {row.step})",
                                  {"path": str(path), "step": row.step})]
        # The step the load test read (nanoGPT's iter_num) is the resume step only if it read the
        # version the job was handed: a single overwritten file the job saved over first (a loaded
        # machine) gives a later step, and the resume step then stays unknown.
        if row.step is not None and same_version:
            out.append(AttemptField(attempt, resume_step=row.step))
        return out
    if not same_version:
        # A single overwritten file (nanoGPT's ckpt.pt) that the resumed job has already saved
        # over: the version it was handed is gone, so this test read another one, or a save
        # half-written. The job loaded its version itself and trains on; stopping it would throw
        # that work away. The new version is verified like any save.
        return [Note(EventName.CHECKPOINT_SUPERSEDED_BEFORE_VERIFIED, Level.INFO,
                     f"the job saved over {path} before the load test of the version it resumed from ended; the job "
                     "loaded that version itself and keeps running, and its new save is verified in the background",
                     {"path": str(path)})]
    why = "; ".join(row.reasons) or "not ready"
    return [Detect(Detection(Cause.CHECKPOINT_LOAD_ERROR,
                             f"the checkpoint attempt {attempt} resumes from, {path}, failed verification: {why}",
                             "checkpoint-verify", step=row.step, evidence=why[:400], details={"path": str(path)},
                             at=wall))]


class CheckpointWatch(OnStart, OnAttempts, OnMetrics, OnTicks, GivesStatus, GivesLiveStatus, GivesEndFacts, Closes):
    """The checkpoint side of each attempt, over the store the wiring hands it."""

    name = "checkpoints"

    def __init__(self, store: CheckpointStorePort) -> None:
        self.store = store
        self._hand: Callable[[Effect], None] = lambda effect: None  # the runner's inbox (DaemonStarted.hand)
        self._attempt = -1  # the run's attempt as the last reaction saw it (the verifier threads read it)
        self._history: deque[MetricRecord] = deque(maxlen=HISTORY_RECORDS)  # as the runner keeps it
        self._verified_key: VersionKey | None = None
        self._verified_dir: Path | None = None  # the dir ``_verified_key`` is of
        self._verifier: threading.Thread | None = None

    def _see(self, run: RunView) -> None:
        self._attempt = run.attempt

    def started(self, n: DaemonStarted, run: RunView) -> Effects:
        self._hand = n.hand
        self._see(run)
        return self.store.adopt(run.cfg).notes()

    def attempt_started(self, n: AttemptStarted, run: RunView) -> Effects:
        self._see(run)
        self.store.writer_active(True)
        pending = self.store.take_beside_start(n.resume.checkpoint)
        if pending is not None:
            self._verify_beside_start(pending.path, pending.layout, n.ctx.attempt)
        return ()

    def _verify_beside_start(self, path: Path, layout: str, attempt: int) -> None:
        """checkpoints.verify = "overlap": the load test of the checkpoint the job resumes from runs
        now, beside the job's own start-up; a failure stops the job (a checkpoint_load_error) and
        the next attempt resumes from an older verified checkpoint."""
        store, hand = self.store, self._hand
        self._verified_key = version_key(store.newest_now())  # the tick must not start a second load test of it
        self._verified_dir = store.svc.dir if store.svc is not None else None
        from ..checkpoints.loadtest import version_token

        launched = version_token(path)  # the version the job was handed, before it can save again

        def verify() -> None:
            from ..checkpoints.loadtest import LoadTestCancelled

            try:
                row = store.verify_chosen(path, layout)
            except LoadTestCancelled:
                return  # the daemon is exiting; close() said so
            except Exception as e:
                log.warning("checkpoint_verify_after_launch_failed", path=str(path), error=repr(e),
                            message="could not verify the checkpoint the job resumed from; the job keeps running")
                return
            finally:
                for note in not_kept_notes(store.take_not_kept()):
                    hand(note)
            if self._attempt != attempt:
                return  # that attempt is over; the next choice sees the cached result
            same = version_token(path) == launched
            if not row.ready and not same:
                self._verified_key = None  # its new save is verified like any save
            for effect in launch_check(row, path, attempt, same_version=same, wall=time.time()):
                hand(effect)

        self._verifier = threading.Thread(target=verify, name="checkpoint-verify-launch", daemon=True)
        self._verifier.start()

    def metrics(self, n: MetricsBatch, run: RunView) -> Effects:
        self._history.extend(n.records)  # the validation metrics the log printed, for a new version's manifest
        return ()

    def attempt_ended(self, n: AttemptEnded, run: RunView) -> Effects:
        self._see(run)
        end = n.end
        if end.spawned and end.cause is not None and end.counted:
            self.store.book_later(n.resume.checkpoint, end.cause.value, n.resume.step)
        return ()

    def tick(self, n: Tick, run: RunView) -> Effects:
        """A checkpoint that appeared while the job runs is verified on a thread of its own."""
        self._see(run)
        # A save not kept is said as soon as it is reported, on this loop: the verifier thread that
        # reported it may spend many seconds on the load test that follows, and a run that ends
        # meanwhile would otherwise lose the event (CI: 15 saves not kept, none in history).
        said = not_kept_notes(self.store.take_not_kept())
        store = self.store
        if store.svc is None or not run.cfg.checkpoints.verify_in_background or not run.has_job:
            return said
        if store.svc.dir != self._verified_dir:  # a found dir replaced: nothing verified in it yet
            self._verified_key, self._verified_dir = None, store.svc.dir
        key = version_key(store.newest())
        if key is None or key == self._verified_key or (self._verifier and self._verifier.is_alive()):
            return said
        self._verified_key = key
        from ..checkpoints.quicklist import metrics_from_records

        # Taken here, on the main loop that keeps the history: the validation metrics the log
        # printed, for the new version's manifest.
        seen = metrics_from_records([r for r in self._history if r.val_loss is not None or r.extra])
        hand = self._hand

        def verify() -> None:
            from ..checkpoints.loadtest import LoadTestCancelled

            try:
                row = store.verify_newest(seen)
            except LoadTestCancelled:
                return  # the daemon is exiting; close() said so
            except Exception as e:
                log.warning("checkpoint_background_verify_failed", error=repr(e))
                return
            finally:
                for note in not_kept_notes(store.take_not_kept()):
                    hand(note)
            if row is not None and not row.ready:
                log.warning("checkpoint_not_ready", path=str(row.path), reasons=list(row.reasons),
                            message=f"the newest checkpoint {row.path} fails the readiness quicklist: "
                                    f"{'; '.join(row.reasons)}; a restart would use an older one")

        self._verifier = threading.Thread(target=verify, name="checkpoint-verify", daemon=True)
        self._verifier.start()
        return said

    def end_facts(self, facts: EndFacts, keepalive: Callable[[], bool], run: RunView) -> EndFacts:
        """The newest checkpoint's weights checked finite (the rollback's check), the job being gone."""
        weights = self.store.newest_weights(keepalive)
        if weights is None:
            return facts  # no checkpoint dir known: the facts say so
        return replace(facts, weights=weights)

    def close(self) -> Effects:
        cancelled = self.store.close()
        said = not_kept_notes(self.store.take_not_kept())  # reported by a verifier since the last tick
        return said + [Note(EventName.CHECKPOINT_LOAD_TEST_CANCELLED, Level.INFO,
                            f"the load test of {path} was stopped unfinished: the supervisor is exiting (no verdict on "
                            "the checkpoint; a later start tests it again)", {"path": path}) for path in cancelled]

    def status(self, run: RunView) -> Mapping[str, Any]:
        if self.store.svc is None:
            return {}
        out: dict[str, Any] = {}
        newest = self.store.newest()
        if newest is not None:
            out["newest_checkpoint"] = str(newest.path)
            out["seconds_since_last_good_checkpoint"] = round(max(0.0, time.time() - newest.mtime), 1)
        # A version not kept is shown even before any good one exists: that is when it matters most.
        lg = self.store.last_good_disk_bytes()
        if lg is not None:
            out["last_good_disk_bytes"] = lg
        out.update(self.live_status())
        return out

    def live_status(self) -> Mapping[str, Any]:
        nk = self.store.last_not_kept()  # set by a verifier thread
        if nk is None:
            return {}
        return {"checkpoint_not_kept": f"{nk[0]}: {nk[1]} ({round(max(0.0, time.time() - nk[2]))} s ago)"}
