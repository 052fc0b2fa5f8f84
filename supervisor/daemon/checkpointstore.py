"""The checkpoint store, a port: checkpoint I/O only (open the service on a dir, verify,
quarantine, choose where an attempt resumes from, book each attempt against its checkpoint), each
result returned as a frozen value (:class:`Opened`, :class:`Booked`, :class:`Chosen`) whose notes
the caller hands on. ``choose`` and ``book_last_attempt`` run on the launch-preparation thread;
the main loop's side (the plug-in :class:`~supervisor.daemon.checkpointwatch.CheckpointWatch`)
reaches it through the plain calls below. With no checkpoint dir every resume is a fresh start."""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence, TypeVar

from ..config.model import Config
from ..core.messages import Resume
from ..core.runend import WeightsCheck
from ..eventnames import EventName
from ..events import Action
from ..core.observations import MetricRecord
from ..levels import Level
from .effects import Note

if TYPE_CHECKING:  # imported where used: a daemon without a checkpoint dir never loads them
    from ..checkpoints.discovery import Candidate
    from ..checkpoints.quarantine import QuarantineRecord
    from ..checkpoints.quicklist import MetricsSeen, Readiness
    from ..checkpoints.selection import Choice
    from ..checkpoints.service import CheckpointService
    from ..job.cgroup import VerifierCgroup

# A checkpoint version as the verifier tells them apart: (path, mtime, size).
VersionKey = tuple[str, float, int]
_M = TypeVar("_M")


def newest_checkpoint(svc: CheckpointService) -> Candidate | None:
    """The newest complete checkpoint by a fresh discovery scan: its own short lock, never the
    service's, which a load test on the preparation thread may hold for seconds."""
    from ..checkpoints.discovery import newest_complete

    return newest_complete(svc.discovery.scan())


def version_key(c: Candidate | None) -> VersionKey | None:
    return None if c is None else (str(c.path), c.mtime, c.size)


def take_all(q: queue.SimpleQueue[_M]) -> list[_M]:
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


@dataclass(frozen=True)
class EndedFrom:
    """A counted attempt's end as the booking needs it, from the main loop (``book_later``) to
    the launch-preparation thread (``book_last_attempt``)."""

    checkpoint: str | None  # what it resumed from
    cause: str
    newer: bool  # a newer complete checkpoint appeared while it ran
    step: int | None  # the step it resumed from


@dataclass(frozen=True)
class VerifyBesideStart:
    """A checkpoint chosen with its load test still to run (verify = "overlap"), from the
    preparation thread (``choose``) to the main loop (``take_beside_start``)."""

    path: Path
    layout: str


@dataclass(frozen=True)
class Opened:
    """What ``adopt`` did: the dir a service was opened on (None: none opened now), and whether it
    writes manifests of its own into that folder (said once per folder, before any is written)."""

    dir: Path | None = None
    write_manifests: bool = False

    def notes(self) -> list[Note]:
        if self.dir is None or not self.write_manifests:
            return []
        return [Note(EventName.CHECKPOINT_MANIFESTS_ON, Level.INFO,
                     f"a checkpoint in {self.dir} that comes without a manifest gets one from the supervisor beside it "
                     "(<checkpoint>.manifest.json: its digest, step, config and validation metric, read to verify it "
                     "before a resume; also in last_good/); the checkpoints themselves are never changed. To write "
                     "none: [checkpoints] write_manifests = false (wrap --set checkpoints.write_manifests=false); "
                     "checkpoints without a manifest of their own are then not checked for integrity",
                     {"path": str(self.dir)})]


@dataclass(frozen=True)
class Booked:
    """The ended attempts booked against their checkpoints: those marked bad, (path, cause), and a
    reason to give up when attempts in a row made no progress."""

    marked_bad: tuple[tuple[str | None, str], ...] = ()
    no_progress: str | None = None

    def notes(self) -> list[Note]:
        return [Note(EventName.CHECKPOINT_MARKED_BAD, Level.WARNING,
                     f"checkpoint {path} is marked bad: the job failed from it ({cause}) without producing a newer "
                     "one; the next resume uses an older ready checkpoint", {"path": path, "cause": cause})
                for path, cause in self.marked_bad]


@dataclass(frozen=True)
class Chosen:
    """Where the next attempt resumes from, and what the choice met on the way: the checkpoints
    refused for unsafe pickles (path, why), those moved to quarantine/, and the service's choice
    (None: nothing chosen from the dir)."""

    resume: Resume
    refused: tuple[tuple[str, str], ...] = ()
    quarantined: tuple[QuarantineRecord, ...] = ()
    choice: Choice | None = None

    def notes(self) -> list[Note]:
        out = [Note(EventName.CHECKPOINT_REFUSED_UNSAFE_PICKLE, Level.WARNING,
                    f"checkpoint {path} was not handed to the job on its structural checks: {why}; it was "
                    "load-tested first (weights_only), and an older verified checkpoint is used if that fails",
                    {"path": path, "reason": why}) for path, why in self.refused]
        out += [Note(EventName.CHECKPOINT_QUARANTINED, Level.WARNING,  # the service logged it; keep it in the ledger
                     f"checkpoint {q.source} is bad ({q.reason}); moved to {q.dest} (never deleted)",
                     {"source": str(q.source), "dest": str(q.dest), "reason": q.reason}, ledger_only=True)
                for q in self.quarantined]
        c = self.choice
        if c is not None:
            rd = c.readiness.to_json() if c.readiness is not None else None
            out.append(Note(EventName.CHECKPOINT_CHOSEN, Level.INFO,
                            f"resuming from {c.path} (step {c.step}): {c.reason}"
                            + (f"; passed over {len(c.skipped)} newer" if c.skipped else ""),
                            {"path": str(c.path), "step": c.step, "skipped": [list(x) for x in c.skipped] or None,
                             "readiness": rd}, ledger_only=True))
        return out


class CheckpointStorePort:
    """The ``CheckpointStore`` port (daemon/ports.py) over the checkpoint service of the dir in
    force; ``takes_checkpoint``: whether the job is known to take a choice (the discovery's answer,
    set by the wiring), read on the preparation thread."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.svc: CheckpointService | None = None  # once a checkpoint dir is configured or found
        self.takes_checkpoint: Callable[[], bool] = lambda: True
        self._newest_at_launch: VersionKey | None = None
        # Between the main loop and the preparation thread, only frozen messages: the ends to book,
        # and the choice whose load test runs beside the start (each way one queue).
        self._to_book: queue.SimpleQueue[EndedFrom] = queue.SimpleQueue()
        self._to_verify: queue.SimpleQueue[VerifyBesideStart] = queue.SimpleQueue()
        self._newest_cache: Candidate | None = None
        self._newest_at = float("-inf")
        self._scan_every_s = 5.0
        self._verifier_cgroup: VerifierCgroup | None = None  # the load tests' low-weight cgroup

    def adopt(self, cfg: Config, *, replace: bool = False) -> Opened:
        """Open the checkpoint service on ``cfg``'s checkpoint dir (at start, or later when the
        dir was found while the job ran: supervisor.daemon.ckptdiscovery); ``replace``: a found
        dir the job has moved on from (Lightning's version_N/checkpoints of each new run)."""
        # A save is seen settled within settle_s of its last write; looking only every 5 s left
        # it unverified for up to 5 s more (a save every few seconds was then rarely verified
        # before the next one overwrote it). A scan is a glob and a few stats.
        self._scan_every_s = min(5.0, max(0.5, cfg.checkpoints.settle_s))
        d = cfg.checkpoint_dir()
        if d is None:
            return Opened()
        # Only with a checkpoint dir: its imports are not on a dir-less daemon's way to the first launch.
        from ..checkpoints.service import CheckpointService

        if self.svc is not None:
            if not replace or self.svc.dir == d:
                return Opened()
            old, self.svc = self.svc, None
            old.close()  # its load tests under way stop; their verifier threads end with LoadTestCancelled
            self._newest_cache = None
            take_all(self._to_verify)  # a choice in the old dir: no load test of it beside the start
        d.mkdir(parents=True, exist_ok=True)
        if self._verifier_cgroup is None and cfg.job.cgroup:  # the job has a cgroup: its verifier one beside it
            from ..job.cgroup import VerifierCgroup

            self._verifier_cgroup = VerifierCgroup()
        self.svc = CheckpointService(cfg.checkpoints, d, self.state_dir, cfg.job.python,
                                     list(cfg.job.command), cfg.workdir(), remedy_keys=remedy_keys(cfg),
                                     verifier_cgroup=self._verifier_cgroup)
        self._newest_at = float("-inf")
        return Opened(d, self.svc.write_manifests)

    # -- the preparation thread -------------------------------------------------------------
    def book_last_attempt(self) -> Booked:
        """Book the attempts ended since the last preparation against their checkpoints (a
        checkpoint failed from twice is marked bad); a reason to give up on no progress."""
        ended = take_all(self._to_book)
        svc = self.svc
        if svc is None or not ended:
            return Booked()
        bad = tuple((e.checkpoint, e.cause) for e in ended  # one per attempt ended (one, in practice)
                    if svc.note_attempt_result(e.checkpoint, e.cause, e.newer, step=e.step))
        if not svc.no_progress():
            return Booked(bad)
        return Booked(bad, f"no progress: {svc.attempts_without_progress()} attempts in a row failed without a newer "
                           f"checkpoint (steps resumed from: {svc.steps_seen()}; "
                           f"checkpoints.no_progress_attempts = {svc.cfg.no_progress_attempts})")

    def choose(self, cfg: Config, action: Action, onset_step: int | None, explicit: str | None,
               metrics: Sequence[MetricRecord]) -> Chosen:
        """Verify, quarantine, choose (seconds); whether the job is known to take the choice
        (``takes_checkpoint``, set by the checkpoint discovery)."""
        chosen = self._choose(cfg, action, onset_step, explicit, metrics)
        resume = chosen.resume
        if resume.checkpoint and not self.takes_checkpoint():
            return replace(chosen, resume=replace(resume, handed=False))
        return chosen

    def _choose(self, cfg: Config, action: Action, onset_step: int | None, explicit: str | None,
                metrics: Sequence[MetricRecord]) -> Chosen:
        if explicit:
            return Chosen(Resume(explicit, None, "the operator's choice (restart --from)"))
        svc = self.svc
        if svc is None:
            return Chosen(Resume(None, None, "no checkpoint dir configured or found"))
        from ..checkpoints.quicklist import metrics_from_records

        svc.set_writer_active(False)  # the previous attempt's group is gone
        overlap = cfg.checkpoints.verify == "overlap"
        if not overlap:  # with overlap, the version chosen is kept once its load test passes
            svc.preserve_single_checkpoints()
        outcome = svc.choose(action, onset_step, metrics_from_records(list(metrics)), overlap=overlap)
        choice = outcome.choice
        take_all(self._to_verify)  # a choice whose attempt never started (its spawn failed) is stale
        if choice is not None and choice.verify_pending:
            self._to_verify.put(VerifyBesideStart(choice.path, choice.layout))
        self._newest_at_launch = version_key(newest_checkpoint(svc))
        if choice is None:
            resume = Resume(None, None, "no ready checkpoint: " + ("every candidate failed the quicklist"
                                                                   if svc.scan() else "none written yet"))
        else:
            resume = Resume(str(choice.path), choice.step, choice.reason)
        return Chosen(resume, tuple(outcome.refused), tuple(outcome.quarantined), choice)

    def ready_steps(self) -> dict[int, str]:
        svc = self.svc
        if svc is None:
            return {}
        svc.set_writer_active(False)  # the previous attempt's group is gone
        return {int(r.step): str(r.path) for r in reversed(svc.quicklist()) if r.ready and not r.bad and r.step is not None}

    def emergency_checkpoint_probe(self) -> Callable[[], bool] | None:
        if self.svc is None:  # no checkpoint dir configured: nothing to wait for
            return None
        before = version_key(newest_checkpoint(self.svc))

        def probe() -> bool:
            # A new complete checkpoint (not a temp file, settled) is the emergency one (in the
            # service of now: a found dir the job moved to may have replaced it).
            svc = self.svc
            key = version_key(newest_checkpoint(svc)) if svc is not None else None
            return key is not None and key != before

        return probe

    # -- the main loop's side (the plug-in's calls) ------------------------------------------
    def writer_active(self, active: bool) -> None:
        """Whether the job's group may still write the dir (its attempt runs)."""
        if self.svc is not None:
            self.svc.set_writer_active(active)

    def take_beside_start(self, checkpoint: str | None) -> VerifyBesideStart | None:
        """The choice whose load test runs beside the start of the attempt resuming from ``checkpoint``."""
        pending = [p for p in take_all(self._to_verify) if str(p.path) == checkpoint]
        return pending[-1] if pending and self.svc is not None else None

    def book_later(self, checkpoint: str | None, cause: str, step: int | None) -> None:
        """A counted attempt ended: noted here, booked on the preparation thread (the service's
        bookkeeping takes its lock, which a background load test may hold for seconds)."""
        if self.svc is None:
            return
        self.svc.set_writer_active(False)  # the attempt's group is gone: nothing still writes
        newer = version_key(newest_checkpoint(self.svc)) != self._newest_at_launch
        self._to_book.put(EndedFrom(checkpoint, cause, newer, step))

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

    def newest_now(self) -> Candidate | None:
        """The newest complete checkpoint by a fresh scan (None without a dir)."""
        return newest_checkpoint(self.svc) if self.svc is not None else None

    def newest_bytes(self) -> int | None:
        """The size of the newest complete checkpoint (the host monitor's disk check: room for one more)."""
        newest = self.newest()
        return newest.size if newest is not None else None

    def verify_chosen(self, path: Path, layout: str) -> Readiness:
        """The load test of the checkpoint an attempt resumes from (on a verifier thread)."""
        assert self.svc is not None
        return self.svc.verify_chosen(path, layout)

    def verify_newest(self, seen: MetricsSeen) -> Readiness | None:
        """The newest version verified (on a verifier thread); ``seen``: the validation metrics printed."""
        assert self.svc is not None
        return self.svc.verify_newest(seen)

    def take_not_kept(self) -> list[tuple[str, str]]:
        """The (path, why) of saves that could not be kept in last_good/ since the last call."""
        return self.svc.take_not_kept() if self.svc is not None else []

    def last_not_kept(self) -> tuple[str, str, float] | None:
        """(path, why, unix time) of the last save not kept (set by a verifier thread)."""
        return self.svc.last_not_kept if self.svc is not None else None

    def last_good_disk_bytes(self) -> int | None:
        return self.svc.last_good_disk_bytes() if self.svc is not None else None  # a scandir and a few stats

    def newest_weights(self, keepalive: Callable[[], bool]) -> WeightsCheck | None:
        """The newest checkpoint's weights checked finite (the rollback's check); None without a dir."""
        if self.svc is None:
            return None
        from .endweights import check_newest_weights

        return check_newest_weights(self.svc, keepalive)

    def close(self) -> list[str]:
        """Stop the load tests under way; the paths whose tests were stopped."""
        return self.svc.close() if self.svc is not None else []
