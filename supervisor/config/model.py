"""The daemon's configuration: TOML -> one frozen :class:`Config`.

Sections owned by other concerns (watch, checkpoints, health, ops, cluster) live in their own
``config.py``, the ones the core decides from in ``core/settings.py``; this module composes them,
adds ``[job]``, ``[state]`` and ``[log]``, and runs the checks that span sections. ``load_config`` raises :class:`ConfigError` listing *every* problem.
"""

from __future__ import annotations

import math
import os
import stat
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping

from ..checkpoints.config import CheckpointsConfig
from ..cluster.config import ClusterConfig, cluster_problems
from .schema import MISSING, Problem, build
from ..core.causes import CAUSES, Action, Cause
from ..core.settings import OnCause, PolicyConfig, Remedy, ShutdownConfig, ValidationConfig, find_flag
from ..fieldmeta import meta
from ..errors import SupervisorError
from ..health.config import GpuConfig, HostConfig
from ..ops.config import MetricsConfig, NotifyConfig, SystemdConfig, WebConfig, web_problems
from ..watch.config import DetectorsConfig, HeartbeatConfig


class ConfigError(SupervisorError):
    """Raised when a config file cannot be used. ``problems`` lists every problem found.

    The daemon exits 2 and prints each one; fix them all and run ``check-config`` again.
    """

    code = "bad_config"

    def __init__(self, source: str, problems: list[Problem]) -> None:
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{source}: {len(problems)} problem(s):\n{lines}")


@dataclass(frozen=True)
class JobConfig:
    name: str = field(default="job", metadata=meta(
        "names the run, the state dir and the unit instance",
        check=lambda v: (f'expected a name without control characters, got {v!r}'
                         if any(ord(c) < 32 or ord(c) == 127 for c in v)
                         else None if v and "/" not in v and v not in (".", "..")
                         else f'expected a name without "/", got "{v}"')))
    command: tuple[str, ...] = field(default=(), metadata=meta(
        "the launch command as an argv array (a single string when shell = true)"))
    workdir: str | None = field(default=None, metadata=meta("working directory of the job (default: the daemon's)"))
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), metadata=meta(
        "extra environment for the job, on top of the daemon's (values are never logged when the "
        "name contains TOKEN, KEY, SECRET or PASSWORD)"))
    inherit_env: bool = field(default=True, metadata=meta("start from the daemon's environment"))
    unbuffered: bool = field(default=True, metadata=meta(
        "set PYTHONUNBUFFERED=1 for the job (unless its environment sets it), so a Python job's lines "
        "reach the detectors when printed, not in 4-8 KiB blocks or at exit; false leaves it alone"))
    shell: bool = field(default=False, metadata=meta("true: command is one string run by /bin/sh -c"))
    resume_args: tuple[str, ...] = field(default=(), metadata=meta(
        "args appended only when resuming; {checkpoint} is replaced by the checkpoint path"))
    log_file: str | None = field(default=None, metadata=meta(
        "copy of the job's stdout+stderr (appended); default <state dir>/job.log"))
    log_max_bytes: int = field(default=1 << 30, metadata=meta(
        "rotate the job log (and its job.stderr.log) when it reaches this size: it is renamed to job.log.1 "
        "(older ones to .2, ...) and a new one opened, between two lines, nothing lost; 0: never (it grows, "
        "or logrotate rotates it)", min=0,
        check=lambda v: None if v == 0 or v >= 4096 else f"expected 0 (never) or at least 4096 bytes, got {v}"))
    log_keep: int = field(default=5, metadata=meta(
        "rotated job logs kept (job.log.1 ... job.log.N, newest first); the oldest beyond is deleted",
        min=1, max=100))
    watch_files: tuple[str, ...] = field(default=(), metadata=meta(
        "extra log files to tail (globs, relative to workdir), e.g. torchrun --log-dir rank files"))
    python: str | None = field(default=None, metadata=meta(
        "the job's Python, for checkpoint load tests and the environment snapshot "
        "(default: found from the command, else the daemon's)"))
    cgroup: bool = field(default=True, metadata=meta(
        "run each attempt in a cgroup (v2) of its own where the daemon may create one (as root, or under "
        "systemd with Delegate=yes): a stop then reaches every process the job started, wherever it went; "
        "false, or where none can be made: tracked by session, process group and subreaper"))
    prewarm: bool = field(default=True, metadata=meta(
        "pre-warmed restart for a plain Python job (python script.py / python -m module): once the attempt "
        "has shown a training step and run 5 s past it, a standby interpreter of the job's Python, options, "
        "env and cwd imports, at idle priority, what the attempt imported (installed modules only; ~300 MiB "
        "for a torch job, its rss and CPU in status) and runs the next attempt's exact argv; any doubt "
        "(torchrun, a shell, a changed env variable, interpreter or installed module, no standby ready) "
        "starts cold, the reason in history; false on memory-tight nodes"))
    tty: str = field(default="auto", metadata=meta(
        "auto: where the supervisor's own stdout/stderr is a terminal (wrap or run in a shell), the job's "
        "stream gets a terminal too (a pty), so its live progress bars (Rich, tqdm) show while every byte "
        "is still read; always: a pty even into a pipe or the journal; never: pipes",
        choices=("auto", "always", "never")))


@dataclass(frozen=True)
class StateConfig:
    dir: str | None = field(default=None, metadata=meta(
        "ledger, control socket, heartbeats, reports (default: $STATE_DIRECTORY/NAME under systemd, "
        "else ./.tsup/NAME)"))


@dataclass(frozen=True)
class LogConfig:
    format: str = field(default="auto", metadata=meta(
        "auto: console on a TTY, logfmt under the journal or a pipe",
        choices=("auto", "console", "logfmt", "json")))
    level: str = field(default="info", metadata=meta("lowest level logged",
                                                     choices=("debug", "info", "warning", "error")))


@dataclass(frozen=True)
class Config:
    job: JobConfig = field(default_factory=JobConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    shutdown: ShutdownConfig = field(default_factory=ShutdownConfig)
    state: StateConfig = field(default_factory=StateConfig)
    log: LogConfig = field(default_factory=LogConfig)
    on: Mapping[str, OnCause] = field(default_factory=lambda: MappingProxyType({}), metadata=meta(
        "per-cause action and remedy ladder: [on.nan] action = \"rollback\""))
    heartbeat: HeartbeatConfig = field(default_factory=HeartbeatConfig)
    detectors: DetectorsConfig = field(default_factory=DetectorsConfig)
    checkpoints: CheckpointsConfig = field(default_factory=CheckpointsConfig)
    gpu: GpuConfig = field(default_factory=GpuConfig)
    host: HostConfig = field(default_factory=HostConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    web: WebConfig = field(default_factory=WebConfig)
    systemd: SystemdConfig = field(default_factory=SystemdConfig)
    notify: NotifyConfig = field(default_factory=NotifyConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    # -- derived values -------------------------------------------------------------------
    def action_for(self, cause: Cause) -> Action:
        oc = self.on.get(cause.value)
        if oc is not None and oc.action is not None:
            return oc.action
        return CAUSES[cause].default

    def action_configured(self, cause: Cause) -> bool:
        oc = self.on.get(cause.value)
        return oc is not None and oc.action is not None

    def remedies_for(self, cause: Cause) -> tuple[Remedy, ...]:
        oc = self.on.get(cause.value)
        return oc.remedies if oc is not None else ()

    def state_dir(self) -> Path:
        if self.state.dir:
            return Path(self.state.dir).expanduser()
        sysd = os.environ.get("STATE_DIRECTORY")
        if sysd:
            # systemd may pass several dirs separated by ':'; ours is the first.
            return Path(sysd.split(":")[0]) / self.job.name
        return Path(".tsup") / self.job.name

    def workdir(self) -> Path:
        return Path(self.job.workdir).expanduser() if self.job.workdir else Path.cwd()

    def checkpoint_dir(self) -> Path | None:
        d = self.checkpoints.dir
        if not d:
            return None
        p = Path(d).expanduser()
        return p if p.is_absolute() else self.workdir() / p

    def log_file(self) -> Path:
        if self.job.log_file:
            p = Path(self.job.log_file).expanduser()
            return p if p.is_absolute() else self.workdir() / p
        return self.state_dir() / "job.log"


def _cross_checks(cfg: Config, problems: list[Problem], need_command: bool) -> None:
    valid_causes = [c.value for c in Cause]
    for key in cfg.on:
        if key not in valid_causes:
            import difflib
            hint = difflib.get_close_matches(key, valid_causes, n=1)
            problems.append(Problem(f"on.{key}", "unknown cause" + (
                f" (did you mean 'on.{hint[0]}'?)" if hint else f" (causes: {', '.join(valid_causes)})")))
    if need_command and not cfg.job.command and not any(p.path.startswith("job.command") for p in problems):
        problems.append(Problem("job.command", "required: expected the launch command, e.g. "
                                               '["python", "train.py"]'))
    if cfg.job.command and not cfg.job.command[0].strip():
        problems.append(Problem("job.command", "the program (its first element) is empty; expected the launch "
                                               'command, e.g. ["python", "train.py"]'))
    elif any("\0" in a for a in cfg.job.command):
        problems.append(Problem("job.command", "an argument holds a NUL character, which no program can receive"))
    if cfg.job.shell and len(cfg.job.command) > 1:
        problems.append(Problem("job.command", "with job.shell = true, expected one string"))
    if cfg.policy.backoff_max_s < cfg.policy.backoff_initial_s:
        problems.append(Problem("policy.backoff_max_s",
                                f"expected >= policy.backoff_initial_s ({cfg.policy.backoff_initial_s:g}), "
                                f"got {cfg.policy.backoff_max_s:g}"))
    _check_scales(cfg, problems)
    problems.extend(cluster_problems(cfg.cluster))
    problems.extend(web_problems(cfg.web))
    if cfg.job.workdir and not Path(cfg.job.workdir).expanduser().is_dir():
        problems.append(Problem("job.workdir", f'expected an existing directory, got "{cfg.job.workdir}"'))


def _check_scales(cfg: Config, problems: list[Problem]) -> None:
    """A scale remedy names a flag with a number in job.command, and a factor > 0."""
    for key, oc in cfg.on.items():
        for n, r in enumerate(oc.remedies):
            for flag, factor in r.scale.items():
                path = f"on.{key}.remedies[{n}].scale.{flag}"
                if factor <= 0:
                    problems.append(Problem(path, f"expected a factor > 0, got {factor:g}"))
                if not flag.startswith("-"):
                    problems.append(Problem(path, f'expected a flag such as "--learning_rate", got "{flag}"'))
                    continue
                if cfg.job.shell:
                    problems.append(Problem(path, "a scale remedy needs job.command as an argv (job.shell = false)"))
                    continue
                if not cfg.job.command:
                    continue
                hit = find_flag(cfg.job.command, flag)
                if hit is None:
                    problems.append(Problem(path, f"{flag} is not in job.command; a scale remedy multiplies a "
                                                  "value already there (add it, or use args)"))
                else:
                    try:
                        value = float(hit[1])
                    except ValueError:
                        problems.append(Problem(path, f"{flag}'s value in job.command is not a number: {hit[1]!r}"))
                    else:
                        if not math.isfinite(value):  # scaling nan/inf gives nan/inf: the job would never start
                            problems.append(Problem(path, f"{flag}'s value in job.command is not finite: {hit[1]!r}; "
                                                          "a scale remedy needs a finite number to multiply"))
                if not math.isfinite(factor):
                    problems.append(Problem(path, f"expected a finite factor, got {factor!r}"))


def _preprocess(table: dict[str, Any], problems: list[Problem]) -> dict[str, Any]:
    job = table.get("job")
    if isinstance(job, dict) and isinstance(job.get("command"), str):
        job = dict(job)
        if job.get("shell") is True:
            job["command"] = [job["command"]]
        else:
            problems.append(Problem("job.command", "expected an array of strings such as "
                                                   '["python", "train.py"] (a single string needs job.shell = true)'))
            job.pop("command")
        table = {**table, "job": job}
    return table


def config_from_table(table: Mapping[str, Any], source: str = "<config>", *, need_command: bool = True) -> Config:
    problems: list[Problem] = []
    table = _preprocess(dict(table), problems)
    cfg = build(Config, table, "", problems)
    if cfg is MISSING:
        raise ConfigError(source, problems)
    _cross_checks(cfg, problems, need_command)
    if problems:
        raise ConfigError(source, problems)
    return cfg


MAX_CONFIG_BYTES = 1 << 20  # a config is a few kB; a bound keeps a wrong path (a log, a device) cheap


def read_toml(path: Path) -> dict[str, Any]:
    """The one reader of a config file (start, reload, check-config): a regular file only (opened
    non-blocking, so a FIFO never blocks the caller), at most MAX_CONFIG_BYTES, valid UTF-8 and TOML
    (nesting too deep for the parser included); every failure is a ConfigError naming the problem."""
    def bad(msg: str) -> ConfigError:
        return ConfigError(str(path), [Problem("", msg)])
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise bad("file not found") from None
    except PermissionError:
        raise bad("permission denied reading the file") from None
    except OSError as e:
        raise bad(f"cannot open the file: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise bad("is a directory, expected a TOML file")
        if not stat.S_ISREG(st.st_mode):
            raise bad("is not a regular file (a FIFO, socket or device); point the config at a TOML file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise bad(f"cannot read the file: {e.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_CONFIG_BYTES:
        raise bad(f"is larger than {MAX_CONFIG_BYTES} bytes; a config is a few kB: is this the right file?")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad(f"is not valid UTF-8 (byte {e.start}): save the file as UTF-8") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise bad(f"not valid TOML: {e}") from None
    except RecursionError:
        raise bad("not valid TOML: nested too deeply (tables or arrays inside each other)") from None


def load_config(path: str | Path, *, need_command: bool = True) -> Config:
    """Load and validate a config file; raises ConfigError with every problem."""
    p = Path(path)
    return config_from_table(read_toml(p), str(p), need_command=need_command)



@dataclass(frozen=True)
class ConfigSource:
    """Where the daemon's config comes from, for a reload: the file read again and whatever the
    command line put over it (``wrap --config FILE --backoff 0 -- CMD``: the file has no command;
    reading it alone refused every reload with "job.command: required")."""

    path: Path
    load: Callable[[], Config]

    @staticmethod
    def of_file(path: str | Path) -> ConfigSource:
        p = Path(path)
        return ConfigSource(p, lambda: load_config(p))
