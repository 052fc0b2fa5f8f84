"""The checkpoint facade the runner and the CLI use: quicklist, the pre-resume gate, bad marks.

All methods are thread-safe (one lock): hashing and load tests take seconds, so the runner calls
them from a worker thread while its main loop keeps ticking.

Typical use by the runner::

    svc = CheckpointService(cfg.checkpoints, Path(cfg.checkpoints.dir), state_dir, job_python=...,
                            job_argv=command, job_cwd=workdir)
    choice = svc.choose_for_resume(Action.ROLLBACK, onset_step=detection.onset_step)
    # choice.path -> TSUP_RESUME_FROM / {checkpoint}; choice.quarantined -> ledger events
    svc.note_attempt_result(choice.path, cause, newer_checkpoint_appeared=...)

A rollback also checks that every tensor of its target is finite (the load test with
``check_finite``, whatever ``checkpoints.check_finite`` says): a divergence is not seen where it
begins. A checkpoint saved after the update that made the weights NaN but before a NaN was
printed (the next logged step, or ``logging_steps`` later) sits *before* the onset, holds NaN
weights, and resuming from it fails again at once. Such a checkpoint is skipped (not ready),
not quarantined: it is intact, just useless.
"""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Sequence

import structlog


from .config import CheckpointsConfig
from .discovery import Candidate, Discovery, Layout, newest_complete, sort_newest_first
from .folderlinks import folder_link_out
from .hashing import DigestCache, tree_digest
from .integrity import check_integrity, stat_changed, write_own_manifest
from .layouts.names import name_step
from .layouts.registry import keeps_last_good
from .loadtest import LoadTestResult, LoadTests, resolve_job_python, version_token
from .manifest import read_manifest, record_metric, stat_record
from .quarantine import (LastGoodKeeper, last_good_disk_bytes, last_good_path)
from .pickledeny import scan_verdict
from .scancache import cached_refusal
from .quicklist import (TRAIN_LOSS, MetricsSeen, Readiness, RowBuilder, compare_config, current_config,
                        nonfinite_metric, val_metric_for)
from .selection import CheckpointBook, Choice
from .keepfirst import SnapshotFirst
from .snapshot import Headroom
from .structure import structure_problem
from .verdicts import FILE_NAME as VERDICTS_FILE, VerdictStore
from .resumechoice import Outcome, choose

log = structlog.get_logger("supervisor.checkpoints")


class CheckpointService:
    def __init__(self, cfg: CheckpointsConfig, checkpoint_dir: Path, state_dir: Path, job_python: str | None,
                 job_argv: Sequence[str], job_cwd: Path | None, *, remedy_keys: Sequence[str] = (),
                 write_manifests: bool | None = None, clock: Callable[[], float] = time.time,
                 verifier_cgroup: Any = None) -> None:
        self.cfg = cfg
        # Absolute where they were given (the CLI: where the operator typed them): the load tests
        # run in the job's working directory, where a relative path names another file or none
        # (every checkpoint "ready: No", FileNotFoundError), and verdicts are kept by path.
        self.dir = Path(os.path.abspath(checkpoint_dir))
        self.state_dir = Path(os.path.abspath(state_dir))
        self.job_argv = list(job_argv)
        self.job_cwd = Path(os.path.abspath(job_cwd)) if job_cwd is not None else None
        self.job_python = job_python or resolve_job_python(cfg.python, self.job_argv, self.job_cwd)
        self.remedy_keys = tuple(remedy_keys)
        self.write_manifests = cfg.write_manifests if write_manifests is None else write_manifests
        self.discovery = Discovery(self.dir, glob=cfg.glob, step_regex=cfg.step_regex, settle_s=cfg.settle_s,
                                   clock=clock, follow_symlinks_out=cfg.follow_symlinks_out)
        self.digests = DigestCache(self.state_dir / "checkpoint_digests.json" if self.state_dir.is_dir() else None)
        self.book = CheckpointBook(self.state_dir, bad_after_same_cause=cfg.bad_after_same_cause)
        self._lock = threading.RLock()
        self.load_tests = LoadTests(self.job_python, expected_keys=cfg.expected_keys, check_finite=cfg.check_finite,
                                    trust_pickles=cfg.trust_pickles, mmap=cfg.mmap, timeout_s=cfg.load_timeout_s,
                                    cwd=self.job_cwd, warm=cfg.warm_verifier, store=self._verdict_store(),
                                    cgroup=verifier_cgroup)
        self.headroom = Headroom(cfg.last_good_headroom_factor, cfg.last_good_min_free_fraction)
        self.last_good = LastGoodKeeper(cfg.last_good_max_bytes, self.headroom)
        self.keep_first = SnapshotFirst(cfg, self.load_tests, self.last_good, self.headroom,
                                        in_place=self._load_test_unlocked, manifest=self._kept_manifest)

    def _verdict_store(self) -> VerdictStore:
        # "weights_only": verdicts that name the files loaded weights-only (pickledeny.scan_verdict
        # reads them); one kept by an earlier version without them is tested again, not misread.
        settings = json.dumps([self.job_python, sorted(self.cfg.expected_keys), self.cfg.trust_pickles, self.cfg.mmap,
                               "weights_only"])
        return VerdictStore(self.state_dir / VERDICTS_FILE if self.state_dir.is_dir() else None, settings)

    # ------------------------------------------------------------------ discovery

    def set_writer_active(self, active: bool) -> None:
        """The runner says whether a job runs (and may still be writing checkpoints)."""
        self.discovery.writer_active = active

    def set_remedy_keys(self, keys: Sequence[str]) -> None:
        """Config keys the active remedies change (allowed to differ from the snapshot)."""
        with self._lock:
            self.remedy_keys = tuple(keys)

    def _manifest_of(self, path: Path) -> Any:
        return read_manifest(path, self.state_dir)

    def scan(self) -> list[Candidate]:
        """Complete, settled checkpoints with steps from their manifests where names lack one."""
        with self._lock:
            out: list[Candidate] = []
            for c in self.discovery.scan():
                if c.step is None:
                    m = self._manifest_of(c.path).manifest
                    # A supervisor manifest made before the job overwrote the file names an old step.
                    fresh = m is not None and not (m.origin == "supervisor" and m.stat is not None
                                                   and stat_changed(m.stat, stat_record(c.path)))
                    if m is not None and fresh and m.step is not None:
                        c = c.with_step(m.step)
                    else:
                        c = c.with_step(self.load_tests.step_read(c.path))
                out.append(c)
            return sort_newest_first(out)

    def newest_complete(self) -> Candidate | None:
        """The newest complete checkpoint (not verified), e.g. to see one appear during shutdown."""
        return newest_complete(self.scan())

    # ------------------------------------------------------------------ readiness

    def _digest(self, path: Path, algorithm: str) -> tuple[str, dict[str, Any] | None]:
        if path.is_dir():
            d, files = tree_digest(path, self.digests, algorithm)
            return d, files
        return self.digests.digest(path, algorithm), None

    def evaluate(self, cand: Candidate, metrics_seen: MetricsSeen | None = None,
                 current: tuple[dict[str, Any], str | None] | None = None, *, finite: bool = False) -> Readiness:
        """One quicklist row for ``cand`` (hashes and load-tests it; results are cached).
        ``finite``: the load test also checks that every tensor is finite (rollback targets)."""
        with self._lock:
            if current is None:
                current = self._current_config()
            cur_cfg = current[0]
            path = cand.path
            row = RowBuilder(path=path, step=cand.step, layout=str(cand.layout), mtime=cand.mtime)
            if cand.layout is Layout.FILE and (doubt := name_step(path.name).doubt):
                row.notes.append(doubt)  # its step came from its manifest or its content
            if not path.exists():
                row.exists = row.complete = False
                row.no("the checkpoint does not exist (moved or deleted)")
                return row.build()
            linked = folder_link_out(path)
            if linked:  # first, before anything reads or moves it; complete: never quarantined
                row.no(linked)
                return row.build()
            problem = structure_problem(path)
            if problem:
                # Milliseconds for any size: a save cut short is rejected before it is hashed or
                # load-tested (a load test costs the job's Python and a torch import).
                row.complete = False
                row.no(problem)
                if self.book.is_bad(path):
                    row.bad = True
                    row.no(f"marked bad: {self.book.bad_reason(path)}")
                return row.build()
            refusal = None if self.cfg.trust_pickles else cached_refusal(path)  # scanned once a version
            mread = self._manifest_of(path)
            manifest = mread.manifest
            if mread.problem:
                row.no(mread.problem)
            stale = (manifest is not None and manifest.origin == "supervisor" and manifest.stat is not None
                     and stat_changed(manifest.stat, stat_record(path)))
            lt: LoadTestResult | None = None
            if (manifest is None and not mread.present) or stale:
                step = cand.step
                if step is None and self.cfg.load_test:
                    before = version_token(path)
                    lt = self.load_tests.run(path, row.layout, finite)
                    if version_token(path) != before:
                        # The step read belongs to the version tested, not to the one on disk now:
                        # no manifest is written for it (a stale step is worse than none).
                        row.no("it changed while it was load-tested (the job saved again): verified once it settles")
                        return row.build()
                    step = lt.step
                if self.write_manifests:
                    if stale:
                        row.notes.append("rewritten since the supervisor's manifest: manifest renewed")
                    manifest = write_own_manifest(path, str(cand.layout), step, cur_cfg or None,
                                                  self.cfg.hash_algorithm, self._digest, self.state_dir)
                    if manifest is not None:
                        row.notes.append("no manifest from the job: the supervisor wrote one (origin=supervisor)")
                else:
                    manifest = None
                    row.notes.append("no manifest: integrity not checked")
            if row.step is None and manifest is not None:
                row.step = manifest.step
            if manifest is not None:
                check_integrity(row, manifest, self.cfg.hash_algorithm, self._digest)
            if manifest is not None and manifest.config is not None:
                compare_config(row, manifest.config, manifest.origin == "supervisor", current,
                               tuple(self.cfg.config_allow_diff) + self.remedy_keys)
            row.val_metric = val_metric_for(row.step, self.cfg.val_metric, manifest.metrics if manifest else None,
                                            metrics_seen)
            if (row.val_metric is not None and manifest is not None and manifest.origin == "supervisor"
                    and self.cfg.val_metric not in manifest.metrics and self.write_manifests):
                # The newest one the log printed at or before this version's step, kept with the
                # version (a single overwritten file gets a fresh manifest per version).
                record_metric(manifest, row.val_metric.name, row.val_metric.value, row.val_metric.step)
            if row.val_metric is None and self.cfg.require_val_metric:
                row.no(f"no validation metric {self.cfg.val_metric!r} recorded for this checkpoint")
            elif nonfinite_metric(row.val_metric, train := val_metric_for(
                    row.step, TRAIN_LOSS, manifest.metrics if manifest else None, metrics_seen)):
                row.no(nonfinite_metric(row.val_metric, train))
            # The load test last: it is the slow part and pointless for a corrupt file.
            if self.cfg.load_test and row.complete and row.sha256_ok is not False:
                lt = lt or self.load_tests.run(path, row.layout, finite)
                row.load_test = lt
                if row.step is None:
                    row.step = lt.step
                if lt.untested:  # no verdict on the checkpoint: the structural checks above decide
                    row.notes.append(f"not load-tested ({lt.untested}): judged on its structural checks alone")
                elif not lt.passed:
                    row.no(f"load test failed: {lt.error}")
                row.notes.extend(lt.notes)
            # The scan's refusal, judged with the load test that ran on this version (none asked
            # for: the one the daemon's or a verb's test left, so the report says the same).
            refused = scan_verdict(refusal, lt or self.load_tests.cached(path, finite))
            if refused:  # never handed over, whatever its weights file's load test says: said first
                row.reasons.insert(0, refused)
                if row.load_test is not None:  # shown as refused, never as a load test that passed
                    row.load_test = replace(row.load_test, refused=refused)
            if self.book.is_bad(path):
                row.bad = True
                row.no(f"marked bad: {self.book.bad_reason(path)}")
            return row.build()

    def _current_config(self) -> tuple[dict[str, Any], str | None]:
        f = self.cfg.job_config_file
        path = None
        if f:
            path = Path(f)
            if not path.is_absolute() and self.job_cwd is not None:
                path = self.job_cwd / path
        return current_config(path, self.job_argv)

    def quicklist(self, metrics_seen: MetricsSeen | None = None) -> list[Readiness]:
        """Every checkpoint's readiness, newest first."""
        with self._lock:
            current = self._current_config()
            rows = [self.evaluate(c, metrics_seen, current) for c in self.scan()]
            return sort_newest_first(rows)

    def verify_newest(self, metrics_seen: MetricsSeen | None = None) -> Readiness | None:
        """Evaluate the newest settled checkpoint now (results are cached by stat), so the
        pre-resume gate finds it verified. Called off the main loop while the job runs;
        ``metrics_seen``: the validation metrics the log printed (recorded in its manifest)."""
        with self._lock:
            newest = newest_complete(self.scan())
            if newest is None:
                return None
        snapped = self.keep_first.verify(newest.path, str(newest.layout))
        if snapped and self.load_tests.cached(newest.path) is None:
            return None  # the job saved again during the snapshot's test: the next tick takes the new save
        with self._lock:
            row = self.evaluate(newest, metrics_seen, self._current_config())
            if snapped and row.val_metric is not None and self.write_manifests:
                self._kept_metric(newest.path, row)
            if keeps_last_good(newest.layout) and self.cfg.preserve_last_good and row.ready and not snapped:
                # Kept at once, not only before a restart: one bad overwrite then costs one save
                # interval, never the whole run.
                try:
                    self._keep_last_good(newest.path)
                except OSError as exc:
                    log.warning("checkpoint_preserve_failed", path=str(newest.path), error=str(exc),
                                next="the previous last good copy stays")
            return row

    def _keep_last_good(self, path: Path) -> Path | None:
        """Keep the version of ``path`` on disk now in last_good/ if it is the one that passed its
        load test (LastGoodKeeper.keep_version: and stays so while it is copied)."""
        version = self.load_tests.passed_version(path) if self.cfg.load_test else version_token(path)
        kept = self.last_good.keep_version(path, version, version_token)
        if kept is not None:
            self.load_tests.carry(path, kept)
        return kept

    def _kept_manifest(self, dest: Path, layout: str, step: int | None) -> None:
        if self.write_manifests:
            write_own_manifest(dest, layout, step, self._current_config()[0] or None, self.cfg.hash_algorithm,
                               self._digest, self.state_dir)

    def _kept_metric(self, path: Path, row: Readiness) -> None:
        """The validation metric recorded for the live version goes into its kept copy's manifest
        too (prefer = "best_val" reads it there), when last_good/ holds that same version."""
        lg, vm = last_good_path(path), row.val_metric
        try:
            same = lg.exists() and (lg.stat().st_mtime_ns, lg.stat().st_size) == (path.stat().st_mtime_ns,
                                                                                  path.stat().st_size)
        except OSError:
            return
        m = self._manifest_of(lg).manifest if same else None
        if vm is not None and m is not None and m.origin == "supervisor" and vm.name not in m.metrics:
            record_metric(m, vm.name, vm.value, vm.step)

    def take_not_kept(self) -> list[tuple[str, str]]:
        """The (path, why) of saves that could not be kept since the last call (keepfirst.py)."""
        return self.keep_first.take_not_kept()

    @property
    def last_not_kept(self) -> tuple[str, str, float] | None:
        """(path, why, unix time) of the last save that could not be kept, for status."""
        return self.keep_first.last_not_kept

    def _load_test_unlocked(self, path: Path, layout: str) -> None:
        """Run (and cache) the load test of a structurally whole file outside the service's lock,
        so the evaluation that follows finds its result. A background verification takes seconds
        (a torch import and a full read); holding the lock that long made a restart's checkpoint
        choice wait for it (measured: 2.8 s more from a kill to the next iteration)."""
        if (self.cfg.load_test and folder_link_out(path) is None and structure_problem(path) is None
                and self.load_tests.cached(path) is None):
            self.load_tests.run(path, layout)

    # ------------------------------------------------------------------ the pre-resume gate

    def structural(self, cand: Candidate) -> tuple[list[str], int | None, bool]:
        """The cheap checks, no hashing and no load test: (why it is unusable, its step when
        known, whether this version already passed its load test)."""
        with self._lock:
            path = cand.path
            try:
                st = stat_record(path)
            except OSError:
                return ["the checkpoint does not exist (moved or deleted)"], None, False
            if self.book.is_bad(path):
                return [f"marked bad: {self.book.bad_reason(path)}"], None, False
            if linked := folder_link_out(path):
                return [linked], cand.step, False
            mread = self._manifest_of(path)
            if mread.problem:
                return [mread.problem], None, False
            m, step = mread.manifest, cand.step
            if m is not None and not (m.origin == "supervisor" and m.stat is not None and stat_changed(m.stat, st)):
                if m.size is not None and m.size != st["size"]:
                    return [f"{st['size']} bytes, the manifest says {m.size}"], None, False
                step = step if step is not None else m.step
                # verify = "overlap" takes the newest on these checks alone: never one whose
                # recorded validation metric is NaN (evaluate says the same).
                nonfinite = nonfinite_metric(val_metric_for(step, self.cfg.val_metric, m.metrics, None),
                                             val_metric_for(step, TRAIN_LOSS, m.metrics, None))
                if nonfinite:
                    return [nonfinite], step, False
            problem = structure_problem(path)
            if problem:
                return [problem], step, False
            done = self.load_tests.cached(path)
            if done is not None and not done.passed and not done.untested:
                return [f"load test failed: {done.error}"], step, False
            return [], step if step is not None or done is None else done.step, done is not None

    def verify_chosen(self, path: Path, layout: str, metrics_seen: MetricsSeen | None = None) -> Readiness:
        """The full readiness row (hash, load test) of a checkpoint chosen with its load test
        pending; a single overwritten file that passes is kept in last_good/ as a verified version."""
        snapped = self.keep_first.verify(path, layout)
        self._load_test_unlocked(path, layout)  # a no-op unless the job saved again meanwhile
        with self._lock:
            try:
                st = stat_record(path)
                cand = Candidate(path, None, Layout(layout), st["mtime_ns"] / 1e9, st["size"])
            except (OSError, ValueError):
                cand = Candidate(path, None, Layout.CUSTOM, 0.0, 0)
            row = self.evaluate(cand, metrics_seen, self._current_config())
            if row.ready and keeps_last_good(cand.layout) and self.cfg.preserve_last_good and not snapped:
                try:
                    self._keep_last_good(path)
                except OSError as exc:
                    log.warning("checkpoint_preserve_failed", path=str(path), error=str(exc),
                                next="the previous last good copy stays")
            return row

    def choose_for_resume(self, action: object, onset_step: int | None,
                          metrics_seen: MetricsSeen | None = None, *, overlap: bool = False) -> Choice | None:
        """The checkpoint to relaunch from, verified now; corrupt or bad ones met on the way are
        quarantined (moved, never deleted) and the next older one is tried (resumechoice.py)."""
        return self.choose(action, onset_step, metrics_seen, overlap=overlap).choice

    def choose(self, action: object, onset_step: int | None, metrics_seen: MetricsSeen | None = None, *,
               overlap: bool = False) -> Outcome:
        """:meth:`choose_for_resume` with what it met on the way: quarantined, refused (the ledger's events)."""
        return choose(self, action, onset_step, metrics_seen, overlap=overlap)

    def close(self) -> list[str]:
        """The supervisor is exiting: stop the load tests under way (never their verdict); the
        paths whose tests were stopped."""
        return self.load_tests.cancel()

    def last_good_disk_bytes(self) -> int | None:
        """Disk bytes held only by last_good/ (None without one); see quarantine.last_good_disk_bytes."""
        return last_good_disk_bytes(self.dir)

    def preserve_single_checkpoints(self) -> list[Path]:
        """Copy verified single overwritten checkpoints to last_good/ (call when a new one appears)."""
        out: list[Path] = []
        with self._lock:
            for c in self.scan():
                if keeps_last_good(c.layout) and self.cfg.preserve_last_good:
                    lg = last_good_path(c.path)
                    if lg.exists() and lg.stat().st_mtime_ns == c.path.stat().st_mtime_ns:
                        continue  # already copied
                    if self.evaluate(c).ready:
                        kept = self._keep_last_good(c.path)
                        if kept is not None:
                            out.append(kept)
        return out

    # ------------------------------------------------------------------ bad marks, progress

    def note_attempt_result(self, checkpoint: Path | str | None, cause: object, newer_checkpoint_appeared: bool,
                            step: int | None = None) -> bool:
        """Record an attempt's end; True when it marked ``checkpoint`` bad (it is then quarantined)."""
        with self._lock:
            return self.book.note_attempt_result(checkpoint, str(cause) if cause is not None else None,
                                                 newer_checkpoint_appeared, step)

    def mark_bad(self, path: Path | str, reason: str) -> None:
        self.book.mark_bad(path, reason)

    def is_bad(self, path: Path | str) -> bool:
        return self.book.is_bad(path)

    def attempts_without_progress(self) -> int:
        return self.book.attempts_without_progress()

    def no_progress(self) -> bool:
        """True when ``no_progress_attempts`` attempts in a row produced no newer checkpoint."""
        return self.book.no_progress(self.cfg.no_progress_attempts)

    def steps_seen(self) -> list[int | None]:
        return self.book.steps_seen()
