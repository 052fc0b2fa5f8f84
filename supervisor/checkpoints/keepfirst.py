"""Snapshot first, the service's side: when a single overwritten checkpoint (nanoGPT ``ckpt.pt``)
settles, capture it in last_good/ (snapshot.py), load-test the capture, keep it once it passes;
a version that could not be kept is reported (``checkpoint_not_kept``), never skipped in silence.

Its own module so the checkpoint facade (service.py) stays about choosing; it runs outside the
service's lock, like the background load test it replaces for these files.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable

import structlog

from .config import CheckpointsConfig
from .layouts.registry import keeps_last_good
from .loadtest import LoadTests, version_token
from .pickledeny import scan_verdict
from .picklescan import scan_refusal
from .quarantine import LastGoodKeeper, last_good_path
from .scancache import cached_refusal
from .snapshot import ChangedWhileCopied, Headroom, NotKeptError, discard, promote, take_snapshot
from .structure import structure_problem

log = structlog.get_logger("supervisor.checkpoints")


class SnapshotFirst:
    """``in_place(path, layout)``: the plain (cached) load test of the live file, the fallback;
    ``manifest(dest, layout, step)``: writes the kept copy's manifest."""

    def __init__(self, cfg: CheckpointsConfig, load_tests: LoadTests, last_good: LastGoodKeeper, headroom: Headroom,
                 *, in_place: Callable[[Path, str], None], manifest: Callable[[Path, str, int | None], None]) -> None:
        self.cfg, self.load_tests, self.last_good, self.headroom = cfg, load_tests, last_good, headroom
        self.in_place, self.manifest = in_place, manifest
        self._lock = threading.Lock()
        self._not_kept: list[tuple[str, str]] = []  # (path, why) not yet reported: take_not_kept
        self.last_not_kept: tuple[str, str, float] | None = None  # (path, why, unix time) for status

    def verify(self, path: Path, layout: str) -> bool:
        """Verify ``path``'s version now, snapshot first where it applies. True when this
        version's keeping was decided here (kept, or not kept and reported), so the caller does
        not copy it again; False when it was only load-tested in place (the caller keeps as before)."""
        if not (self.cfg.load_test and self.cfg.preserve_last_good and keeps_last_good(layout) and path.is_file()
                and structure_problem(path) is None and self.load_tests.cached(path) is None):
            self.in_place(path, layout)
            return False
        try:
            st = path.stat()
            if self.cfg.last_good_max_bytes and st.st_size > self.cfg.last_good_max_bytes:
                self.in_place(path, layout)  # not kept at all: the caller's keep says so
                return False
            lg = last_good_path(path)
            if lg.exists() and (lg.stat().st_mtime_ns, lg.stat().st_size) == (st.st_mtime_ns, st.st_size):
                self.in_place(path, layout)  # this version is kept already
                return False
            snap = take_snapshot(path, link=self.last_good.replaced_by_rename(path, st.st_ino), headroom=self.headroom)
        except NotKeptError as exc:
            self.report_not_kept(path, exc.reason)
            self.in_place(path, layout)  # its readiness is still known, tested in place
            return True
        except (ChangedWhileCopied, OSError):
            self.in_place(path, layout)  # the job is writing: tested (and kept) once it settles
            return False
        try:
            res = self.load_tests.run(snap.path, layout)
            token = version_token(snap.path)
            if version_token(path) == snap.version:  # still on disk: the verdict is the live file's too
                self.load_tests.alias(snap.path, token, path, snap.version)
            if not res.passed:
                return True  # a version that fails is never kept; the live file is judged on its own
            # A version the pickle scan refuses is never kept either: its load test may pass
            # (weights_only reads around a payload a careless loader would run), and a refused
            # copy in last_good/ reads as a verified one. The live file's cached verdict when it
            # is still this version (the service asks the same), else the copy's own scan.
            same = version_token(path) == snap.version
            refused = scan_verdict(cached_refusal(path) if same else scan_refusal(snap.path), res)
            if refused:
                self.report_not_kept(path, refused)
                return True
            dest = promote(snap)
            self.load_tests.alias(snap.path, token, dest, version_token(dest))
            self.manifest(dest, layout, res.step)
            log.info("checkpoint_preserved_last_good", path=str(path), copy=str(dest), how=snap.how, step=res.step,
                     next="a bad overwrite of the original can no longer destroy this verified version")
            return True
        finally:
            discard(snap)  # gone already once promoted; a failed or torn one is ours to remove

    def report_not_kept(self, path: Path, why: str) -> None:
        with self._lock:  # set before the line goes out: a `status` read after it shows this
            self._not_kept.append((str(path), why))
            self.last_not_kept = (str(path), why, time.time())
        log.warning("checkpoint_not_kept", path=str(path), reason=why,
                    next="the job's save stands; a bad overwrite of it falls back to the last kept version")

    def take_not_kept(self) -> list[tuple[str, str]]:
        """The (path, why) of saves that could not be kept since the last call: the daemon books
        each as a ``checkpoint_not_kept`` event."""
        with self._lock:
            out, self._not_kept = self._not_kept, []
            return out
