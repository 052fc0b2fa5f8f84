"""Launching an attempt: exactly what is launched (argv, environment, working directory), and the
record of what it runs on (library versions, git state, the world size). The preparation before it
(bookkeeping, gate, checkpoint choice) drives the daemon's ports: ``daemon/attemptstart.py``."""

from __future__ import annotations

import os
import shlex
import threading
from pathlib import Path
from typing import Any, Mapping

from ..config.model import Config
from ..core.messages import Launch, jsonable
from ..ownpaths import own_dir_fd, own_subdir_fd
from .envsnapshot import snapshot, world_from_launch
from . import torchelastic
from .jobtty import wants_tty
from ..core.policy import merge_args, scale_args
from ..redact import redact_argv
from .process import LaunchSpec, job_python, redact_env

# systemd's own variables must not leak into the job: a job that inherits NOTIFY_SOCKET or
# WATCHDOG_USEC could ping systemd on our behalf.
STRIP_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID",
             "LISTEN_FDNAMES", "INVOCATION_ID")


def config_json(cfg: Config) -> dict[str, Any]:
    """The config as stored in the ledger: secret-looking values of job.env masked."""
    js = jsonable(cfg)
    js["job"]["env"] = redact_env(js["job"]["env"])
    if isinstance(js["job"].get("command"), list):  # --password=x, --token x, URL passwords
        js["job"]["command"] = redact_argv([str(a) for a in js["job"]["command"]])
    for oc in (js.get("on") or {}).values():  # remedies env: masked the same way
        for rem in (oc or {}).get("remedies") or ():
            rem["env"] = redact_env(rem.get("env") or {})
    notify = js.get("notify") or {}
    if notify.get("webhook_url"):  # the URL carries the hook's token
        notify["webhook_url"] = "<redacted>"
    if isinstance(notify.get("command"), list):  # run from the config, never from here: masked like the job's
        notify["command"] = redact_argv([str(a) for a in notify["command"]])
    return js


def heartbeat_dir(state_dir: Path, attempt: int) -> Path:
    # One folder per attempt: a heartbeat or metric line the previous attempt wrote while it
    # was being stopped can never be mistaken for the new attempt's.
    return state_dir / "heartbeats" / f"attempt-{attempt}"


def make_heartbeat_dir(state_dir: Path, attempt: int) -> Path:
    """Create the attempt's heartbeat folder: ``heartbeats/`` checked and held open, the
    attempt's folder made relative to it (ownpaths: a link swapped in cannot redirect it)."""
    hb = heartbeat_dir(state_dir, attempt)
    parent = own_dir_fd(hb.parent, parents=True)
    try:
        os.close(own_subdir_fd(parent, hb.name, hb))
    finally:
        os.close(parent)
    return hb


def drop_heartbeat_dir_if_empty(state_dir: Path, attempt: int) -> None:
    """An ended attempt's heartbeat folder goes when the job wrote nothing there (most jobs do
    not use the client): a week of restarts must not leave thousands of empty folders. One with
    files stays (the client's heartbeats and metric reports, for a post-mortem)."""
    try:
        heartbeat_dir(state_dir, attempt).rmdir()
    except OSError:
        pass  # not empty, or already gone


def resume_args(cfg: Config, checkpoint: str | None) -> list[str]:
    if not checkpoint:
        return []
    return [a.replace("{checkpoint}", checkpoint) for a in cfg.job.resume_args]


def launch_spec(cfg: Config, launch: Launch, *, run_id: str, state_dir: Path,
                job_env: Mapping[str, str]) -> LaunchSpec:
    """The argv and environment of ``launch``'s attempt (creates its heartbeat dir)."""
    resume = launch.resume
    if cfg.job.shell:
        extra = [shlex.quote(a) for a in [*launch.remedy_args, *resume_args(cfg, resume.checkpoint)]]
        argv = ["/bin/sh", "-c", " ".join([cfg.job.command[0], *extra])]
    else:
        argv = scale_args(merge_args(list(cfg.job.command), launch.remedy_args), launch.remedy_scale)
        argv += resume_args(cfg, resume.checkpoint)
    hb = make_heartbeat_dir(state_dir, launch.attempt)
    added: dict[str, str] = dict(job_env)
    added.update(cfg.job.env)
    added.update(launch.remedy_env)
    if launch.diagnostics:
        added.update(cfg.validation.diagnostics_env)
    ckdir = cfg.checkpoint_dir()
    added.update({
        "TSUP_RUN_ID": run_id,
        "TSUP_ATTEMPT": str(launch.attempt),
        "TSUP_RESUME_FROM": resume.checkpoint or "",
        "TSUP_RESUME_STEP": "" if resume.step is None else str(resume.step),
        "TSUP_SKIP_BATCHES": str(launch.skip_batches) if resume.checkpoint else "0",
        "TSUP_HEARTBEAT_DIR": str(hb),
        "TSUP_CHECKPOINT_DIR": str(ckdir) if ckdir else "",
        "TSUP_STATE_DIR": str(state_dir),
        "TSUP_STOP_SIGNAL": cfg.shutdown.stop_signal,
        "TSUP_CHECKPOINT_SIGNAL": cfg.shutdown.checkpoint_signal,
    })
    base = {k: v for k, v in os.environ.items() if k not in STRIP_ENV} if cfg.job.inherit_env else {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    if cfg.job.unbuffered and not base.get("PYTHONUNBUFFERED") and "PYTHONUNBUFFERED" not in added:
        # Python block-buffers stdout into a pipe: without this a NaN line printed at step
        # 60 reaches the detectors minutes later, or only when the job exits.
        added["PYTHONUNBUFFERED"] = "1"
    env = {**base, **added}
    if torchelastic.ENV not in env:  # the job's own choice wins
        # torchrun's agent copies the first failing rank's exception here; read after a failure.
        ef = torchelastic.error_file(state_dir, launch.attempt)
        ef.parent.mkdir(parents=True, exist_ok=True)
        ef.unlink(missing_ok=True)  # an earlier run's attempt of the same number left it
        added[torchelastic.ENV] = env[torchelastic.ENV] = str(ef)
    return LaunchSpec(tuple(argv), str(cfg.workdir()), env, added, cgroup=cfg.job.cgroup,
                      prewarm=cfg.job.prewarm,  # a shell job: cold, and history says why
                      tty=(wants_tty(cfg.job.tty, 1), wants_tty(cfg.job.tty, 2)),
                      log_rotate=(cfg.job.log_max_bytes, cfg.job.log_keep))


def remedies_record(launch: Launch) -> list[dict[str, Any]]:
    """The remedies in force for the ledger's attempt row (empty when none)."""
    if not (launch.remedy_env or launch.remedy_args or launch.skip_batches or launch.remedy_scale):
        return []
    return [{"env": dict(launch.remedy_env), "args": list(launch.remedy_args), "skip_batches": launch.skip_batches,
             "scale": dict(launch.remedy_scale)}]


class Environment:
    """Library versions of the job's Python, git state, host: probed once per daemon life, on a
    thread of its own started with the daemon. It takes 50-250 ms (a subprocess of the job's
    Python; git status takes seconds in a big repository), so the first launch does not wait for
    it: an attempt launched before it finished has its record completed when it arrives."""

    def __init__(self) -> None:
        self._cache: dict[str, Any] | None = None
        self._done = threading.Event()
        self._started = False
        self._lock = threading.Lock()
        self._notes: dict[tuple[str, str], dict[str, Any]] = {}  # the launcher's, per (run, attempt)

    def start(self, cfg: Config) -> None:
        """Begin the probe (once; later calls do nothing)."""
        with self._lock:
            if self._started:
                return
            self._started = True
        threading.Thread(target=self._probe, args=(cfg,), name="environment-probe", daemon=True).start()

    def _probe(self, cfg: Config) -> None:
        try:
            py = job_python(cfg.job.command, cfg.job.python)
            self._cache = snapshot(py, cfg.workdir(), cfg.job.command, {**os.environ, **cfg.job.env})
        except Exception as e:
            self._cache = {"error": repr(e)}
        finally:
            self._done.set()

    def probed(self, wait: float = 0.0) -> Mapping[str, Any] | None:
        """The probe's result, or None while it runs (after waiting up to ``wait`` seconds)."""
        if not self._started or not self._done.wait(wait):
            return None
        return self._cache

    def note(self, spec: LaunchSpec, fields: Mapping[str, Any]) -> None:
        """What the launcher says about how the attempt started (``prewarm``), for its record."""
        self._notes[(spec.env.get("TSUP_RUN_ID", ""), spec.env.get("TSUP_ATTEMPT", ""))] = dict(fields)

    def of_attempt(self, spec: LaunchSpec, extra: Mapping[str, Any]) -> dict[str, Any]:
        """The attempt's own part of its snapshot: its world size, what the monitors saw, and
        how the launcher started it."""
        notes = self._notes.pop((spec.env.get("TSUP_RUN_ID", ""), spec.env.get("TSUP_ATTEMPT", "")), {})
        return {"world": world_from_launch(spec.argv, spec.env), **extra, **notes}
