"""Checkpoint dir and resume discovery: what the config leaves out, found and said.

Without ``[checkpoints] dir`` the dir is read from the command (``--output_dir``, ``--out_dir=``,
nanoGPT's ``out_dir = '...'``, ...: :mod:`supervisor.checkpoints.finddir`), else taken from the
first checkpoint-shaped entry appearing under the working directory (or Lightning's
``default_root_dir``) while the job runs (:mod:`supervisor.checkpoints.appearing`). Without
``job.resume_args`` the resume flag of a known trainer is inferred
(:mod:`supervisor.job.resumeinfer`). What is found is applied to the running config as if it had
been configured (verification, the rollback's choice, ``TSUP_CHECKPOINT_DIR``, the resume args),
said once on the console and in the ledger, and shown by ``status``. An explicit config always
wins. When checkpoints exist but nothing can hand one to the job, one loud warning names the fix.
"""
from __future__ import annotations

import dataclasses
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..checkpoints.appearing import Appeared, scan
from ..checkpoints.finddir import FoundDir, command_argv, dir_from_command
from ..eventnames import EventName
from ..job.launch import heartbeat_dir
from ..job.resumeinfer import InferredResume, infer_resume, reads_resume_env
from ..levels import Level
from .effects import Effect, Note, UseConfig
from .plugin import (AttemptEnded, AttemptStarted, Closes, DaemonStarted, Effects, GivesStatus, OnAttempts, OnStart,
                     OnTicks, RunView, Tick)

if TYPE_CHECKING:
    from ..checkpoints.discovery import Candidate
    from ..config.model import Config

# A bounded walk of the working tree (up to appearing.MAX_ENTRIES stats), on a thread of its own:
# on the loop, each stat waited out a GIL switch interval while the output thread parsed a burst,
# and one scan held the loop (and every control reply behind it) for 60-330 ms.
SCAN_EVERY_S = 5.0
UNHANDED_EVERY_S = 5.0
FIX = "--resume-arg=--resume={checkpoint}"


class JobTakesCheckpoint:
    """Whether the job is known to take a checkpoint handed to it, as one value the wiring hands
    the discovery plug-in (which keeps what it saw here: the config in force, the state dir, the
    attempt, whether the job reads TSUP_RESUME_FROM) and the checkpoint store (which asks, on the
    preparation thread: plain reads of what the loop's last reaction wrote). Neither holds the other."""

    def __init__(self) -> None:
        self.cfg: Config | None = None  # the config in force as the plug-in last saw or made it
        self.state_dir: Path | None = None
        self.attempt = -1
        self.reads_env = False

    def __call__(self) -> bool:
        """Resume args (configured or inferred), or the job reads TSUP_RESUME_FROM (its source, or a
        client heartbeat of this attempt or the one before: a relaunch's choice is made before its
        job runs)."""
        cfg = self.cfg
        return (cfg is None or bool(cfg.job.resume_args) or self.reads_env or self._client_seen(self.attempt)
                or (self.attempt > 0 and self._client_seen(self.attempt - 1)))

    def _client_seen(self, attempt: int) -> bool:
        assert self.state_dir is not None
        try:
            return any(heartbeat_dir(self.state_dir, max(attempt, 0)).iterdir())
        except OSError:
            return False


class CheckpointDiscoveryPlugin(OnStart, OnAttempts, OnTicks, GivesStatus, Closes):
    """Finds the checkpoint dir and resume args the config leaves out; must start before the
    checkpoint and health concerns, which read the checkpoint dir when they start. Given by the
    wiring: ``adopt(cfg, replace)``, the checkpoint store opening its service on a found dir (what
    it says, returned with the found config), ``newest()``, the newest checkpoint seen, and
    ``takes``, what it learns of the job's resuming, shared with the store."""

    name = "checkpoint_discovery"

    def __init__(self, adopt: Callable[..., Effects] = lambda cfg, replace=False: (),
                 newest: Callable[[], Candidate | None] = lambda: None, takes: JobTakesCheckpoint | None = None) -> None:
        self.adopt = adopt
        self.newest = newest
        self.takes = takes or JobTakesCheckpoint()
        self.found: FoundDir | None = None  # a dir not from the config (from the command or a scan)
        self.configured: Path | None = None
        self.roots: list[Path] = []  # where the scan looks while no dir is known
        self.inferred: InferredResume | None = None
        self.since = 0.0
        self.by_scan = False  # the dir was found by a scan (it may move: Lightning's version_N/)
        self._attempt_wall = 0.0
        self._scanned_at = float("-inf")
        self._unhanded_at = float("-inf")
        self._warned = False
        self._pool: ThreadPoolExecutor | None = None
        self._scanning: Future[Appeared | None] | None = None

    def _see(self, run: RunView) -> None:
        self.takes.cfg, self.takes.state_dir, self.takes.attempt = run.cfg, run.state_dir, run.attempt

    # ------------------------------------------------------------------ start
    def started(self, n: DaemonStarted, run: RunView) -> Effects:
        self._see(run)
        try:
            return self._discover(run)
        except Exception as e:  # a guess gone wrong must never stop the supervision of the job
            return self._given_up(e)

    def _given_up(self, e: Exception) -> Effects:
        self.roots = []
        return [Note(EventName.CHECKPOINT_DISCOVERY_FAILED, Level.WARNING, f"could not look for the checkpoint dir "
                     f"or the resume flag ({e!r}); the job runs as configured (set --checkpoint-dir and --resume-arg)")]

    def _discover(self, run: RunView) -> Effects:
        cfg, said = run.cfg, list[Effect]()
        self.since = run.wall - 1.0  # mtimes have coarse resolution on some filesystems
        argv = command_argv(cfg.job.command, cfg.job.shell)
        workdir = cfg.workdir()
        env = {**(os.environ if cfg.job.inherit_env else {}), **cfg.job.env}  # the job's PYTHONPATH, where a `python -m` module is looked for
        self.takes.reads_env = reads_resume_env(argv, workdir, env)
        if not cfg.job.resume_args:
            self.inferred = infer_resume(argv, workdir, env)
            if self.inferred is not None:
                said.append(Note(EventName.RESUME_INFERRED, Level.INFO, f"resume: {self.inferred.why}",
                                 {"args": list(self.inferred.args), "trainer": self.inferred.trainer}))
        if cfg.checkpoints.dir:
            self.configured = cfg.checkpoint_dir()
        else:
            found = dir_from_command(argv, workdir)
            if found is not None and not found.root:
                said += self._found(found, "")
            else:
                self.roots = [found.path] if found is not None else [workdir]
                said.append(Note(EventName.CHECKPOINT_DIR_UNKNOWN, Level.INFO,
                                 "no checkpoint dir configured or named in the command"
                                 + (f" ({found.found_by}: {found.path})" if found is not None else "")
                                 + f"; watching {self.roots[0]} for checkpoint-shaped files the job writes "
                                 "(set --checkpoint-dir / [checkpoints] dir to be explicit)",
                                 {"roots": [str(r) for r in self.roots]}))
        return [*said, *self._apply()]

    def _found(self, found: FoundDir, detail: str) -> Effects:
        self.found = found
        return [Note(EventName.CHECKPOINT_DIR_FOUND, Level.INFO,
                     f"checkpoint dir {found.path} (found by {found.found_by}{detail}); checkpoints there are "
                     "verified and resumed from as if configured (set --checkpoint-dir / [checkpoints] dir to "
                     "override)", {"path": str(found.path), "found_by": found.found_by})]

    def _apply(self, moved: bool = False) -> Effects:
        """The running config with what was found (also again after a reload dropped it)."""
        cfg = new = self.takes.cfg
        assert cfg is not None and new is not None, "applied before it was started"
        if self.found is not None and (moved or not cfg.checkpoints.dir):
            new = dataclasses.replace(new, checkpoints=dataclasses.replace(new.checkpoints, dir=str(self.found.path)))
        if self.inferred is not None and not cfg.job.resume_args:
            new = dataclasses.replace(new, job=dataclasses.replace(new.job, resume_args=self.inferred.args))
        if new is cfg:
            return ()
        self.takes.cfg = new  # in force from the runner's next view; the store's service opens on it now
        return [UseConfig(new), *self.adopt(new, replace=moved)]

    # ------------------------------------------------------------------ while it runs
    def tick(self, n: Tick, run: RunView) -> Effects:
        self._see(run)
        now, said = n.now, list[Effect]()
        if (self.found is not None and not run.cfg.checkpoints.dir) or (
                self.inferred is not None and not run.cfg.job.resume_args):
            said += self._apply()  # a reload of a config file without them
        if self._scanning is not None and self._scanning.done():
            done, self._scanning = self._scanning, None
            if self._dir() is None and self.roots:  # else a scan at the attempt's end found it meanwhile
                said += self._took(done.result)
        if (self._dir() is None and self.roots and run.has_job and self._scanning is None
                and now - self._scanned_at >= SCAN_EVERY_S):
            self._scanned_at = now
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-scan")
            self._scanning = self._pool.submit(scan, list(self.roots), since=self.since, skip=[run.state_dir])
        if not self._warned and self._dir() is not None and now - self._unhanded_at >= UNHANDED_EVERY_S:
            self._unhanded_at = now
            said += self._check_unhanded()
        return said

    def attempt_started(self, n: AttemptStarted, run: RunView) -> Effects:
        self._see(run)
        self._attempt_wall = n.wall
        return ()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)  # a scan in flight ends on its own

    def attempt_ended(self, n: AttemptEnded, run: RunView) -> Effects:
        self._see(run)
        # The job may have saved and died within one scan interval: look before the relaunch chooses.
        if self._dir() is None:
            return self._took(lambda: scan(self.roots, since=self.since, skip=[run.state_dir])) if self.roots else ()
        return self._moved(run.state_dir) if self.by_scan else ()

    def _moved(self, state_dir: Path) -> Effects:
        """A dir found by a scan, and this attempt saved elsewhere (Lightning starts a new
        version_N/ at every run, its checkpoints inside): follow the job to its new folder."""
        assert self.found is not None
        try:
            hit = scan(self.roots, since=self._attempt_wall - 1.0, skip=[state_dir])
        except Exception as e:
            return self._given_up(e)
        if hit is None or hit.folder == self.found.path:
            return ()
        previous = self.found.path
        self.found = FoundDir(hit.folder, self.found.found_by)
        return [Note(EventName.CHECKPOINT_DIR_MOVED, Level.INFO,
                     f"the job now saves its checkpoints in {hit.folder} ({hit.entry.name} appeared there this "
                     f"attempt), no longer in {previous}: resumes are chosen from the new folder (set "
                     "--checkpoint-dir to pin one)", {"path": str(hit.folder), "previous": str(previous)}),
                *self._apply(moved=True)]

    def _dir(self) -> Path | None:
        return self.configured or (self.found.path if self.found else None)

    def _took(self, outcome: Callable[[], Appeared | None]) -> Effects:
        """A scan's outcome (the scan itself, or a finished one's result) applied."""
        try:
            hit = outcome()
        except Exception as e:  # said once; the scan is not tried again (every 5 s it would say it again)
            return self._given_up(e)
        if hit is None:
            return ()
        root = self.roots[0]
        try:
            where = hit.entry.relative_to(root)
        except ValueError:
            where = hit.entry
        self.by_scan = True
        return [*self._found(FoundDir(hit.folder, f"a checkpoint-shaped entry appearing under {root}"),
                             f": {where}, layout {hit.layout.value}"), *self._apply()]

    def _check_unhanded(self) -> Effects:
        """Checkpoints exist but the job cannot be handed one: no resume args (configured or
        inferred), its script does not read TSUP_RESUME_FROM (nor import supervisor.client), and
        it has written no client heartbeat or metric file this attempt nor the one before (a
        relaunched client job writes its first heartbeat only once its imports are done, seconds
        after the checkpoints it resumes from are seen here). Warned once."""
        if self.hands_checkpoint():
            return ()
        newest = self.newest()
        if newest is None:
            return ()
        self._warned = True
        return [Note(EventName.RESUME_UNAVAILABLE, Level.WARNING,
                     f"checkpoints exist ({newest.path}) but nothing hands one to the job: no job.resume_args, no "
                     "known trainer resume flag, and the job does not read TSUP_RESUME_FROM (no supervisor.client); "
                     f"a restart would start it from scratch. Fix: tell it how to resume, e.g. wrap {FIX} (or "
                     "[job] resume_args = [\"--resume\", \"{checkpoint}\"]) with your script's own flag",
                     {"checkpoint": str(newest.path), "fix": FIX})]

    def hands_checkpoint(self) -> bool:
        return self.takes()

    # ------------------------------------------------------------------ status
    def status(self, run: RunView) -> dict[str, Any]:
        if self.takes.cfg is None:
            return {}
        if self.configured is not None:
            where: dict[str, Any] = {"path": str(self.configured), "found_by": "config"}
        elif self.found is not None:
            where = {"path": str(self.found.path), "found_by": self.found.found_by}
        else:
            where = {"path": None, "found_by": None, "looking_under": [str(r) for r in self.roots]}
        args = list(run.cfg.job.resume_args)
        resume: dict[str, Any]
        if self.inferred is not None and tuple(args) == self.inferred.args:
            resume = {"args": args, "source": "inferred", "note": self.inferred.why}
        elif args:
            resume = {"args": args, "source": "config", "note": "job.resume_args"}
        elif self.takes.reads_env:
            resume = {"args": [], "source": "client", "note": "the job reads TSUP_RESUME_FROM"}
        else:
            resume = {"args": [], "source": None, "note": f"no way to hand the job a checkpoint: set {FIX}"}
        return {"checkpoint_dir": where, "resume": resume}
