"""The config tables the core reads, and the view of the whole config it takes.

The core decides from ``[policy]``, ``[shutdown]``, ``[on.<cause>]`` remedies and ``[validation]``;
their frozen tables live here, beside the core, so that the core's imports stop at core and the
top-level leaves. ``config.model`` composes them with the concerns' tables into ``Config``, which
the core sees only as :class:`RunSettings`: importing ``Config`` would pull every concern's config
(watch, checkpoints, health, ops, cluster) into the core's import closure.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Protocol, Sequence

from ..fieldmeta import meta
from .causes import Action, Cause


def signal_problem(value: str) -> str | None:
    name = value.upper()
    if not name.startswith("SIG"):
        name = "SIG" + name
    if not hasattr(signal, name) or name in ("SIG_DFL", "SIG_IGN", "SIG_BLOCK", "SIG_UNBLOCK", "SIG_SETMASK"):
        return f'expected a signal name such as "SIGTERM" or "SIGUSR1", got "{value}"'
    return None


def signal_number(name: str) -> int:
    name = name.upper()
    return int(getattr(signal, name if name.startswith("SIG") else "SIG" + name))


@dataclass(frozen=True)
class PolicyConfig:
    max_restarts: int = field(default=10, metadata=meta(
        "restarts allowed within restart_window_s before giving up (exit 3)", min=0))
    restart_window_s: float = field(default=3600.0, metadata=meta(
        "the sliding window over which restarts are counted", min=0, min_exclusive=True))
    backoff_initial_s: float = field(default=10.0, metadata=meta(
        "delay before relaunching an attempt that failed without progress (no step past its resume "
        "step); one that made progress, or a NaN/spike rollback, relaunches at once", min=0))
    backoff_factor: float = field(default=2.0, metadata=meta(
        "each consecutive failure without progress multiplies the delay by this", min=1))
    backoff_max_s: float = field(default=300.0, metadata=meta("the delay never exceeds this", min=0))
    backoff_jitter: float = field(default=0.1, metadata=meta(
        "random +/- fraction of the delay, so many nodes do not restart in lockstep", min=0, max=1))
    healthy_after_s: float = field(default=600.0, metadata=meta(
        "an attempt that ran this long resets the backoff and the remedy ladder", min=0))
    repeat_step_tolerance: int = field(default=10, metadata=meta(
        "two failures of the same cause this many steps apart or less, resuming from the same checkpoint "
        "with the same command and environment, are one deterministic failure: the second climbs the "
        "remedy ladder at once, or gives up (exit 3) when no rung is left", min=0))
    blind_progress_after_s: float = field(default=60.0, metadata=meta(
        "an attempt whose output no parser understood (metrics_blind) made progress when, past this many seconds "
        "after its launch, it changed a file in its checkpoint dir or watched files, or kept printing (output in "
        "blind_progress_active_s distinct seconds); a failure after progress relaunches without backoff", min=0))
    blind_progress_active_s: int = field(default=5, metadata=meta(
        "distinct seconds with output past blind_progress_after_s that show a blind attempt working (a traceback "
        "takes one or two; 0: a blind attempt never counts as progress)", min=0))


@dataclass(frozen=True)
class ShutdownConfig:
    mode: str = field(default="graceful", metadata=meta(
        "graceful: stop signal, wait grace_s, SIGKILL; hybrid: checkpoint signal, wait for the "
        "checkpoint, then graceful; forced: SIGKILL at once",
        choices=("graceful", "forced", "hybrid")))
    grace_s: float = field(default=120.0, metadata=meta(
        "how long the job may take to flush and exit after the stop signal", min=0))
    stop_signal: str = field(default="SIGTERM", metadata=meta("sent to the job's process group to stop it",
                                                               check=signal_problem))
    checkpoint_signal: str = field(default="SIGUSR1", metadata=meta(
        "asks the job for an emergency checkpoint (hybrid mode, checkpoint-now)", check=signal_problem))
    checkpoint_timeout_s: float = field(default=300.0, metadata=meta(
        "hybrid: how long to wait for the emergency checkpoint to appear", min=0))
    hang_grace_s: float = field(default=10.0, metadata=meta(
        "grace for a job stopped because it hangs (it will not flush anything)", min=0))
    leftover_grace_s: float = field(default=10.0, metadata=meta(
        "grace for processes left in the job's group after its main process exited", min=0))


@dataclass(frozen=True)
class Remedy:
    """One rung of a remedy ladder: extra env, extra/replacing args, batches to skip."""

    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), metadata=meta(
        "environment added to the following attempts"))
    args: tuple[str, ...] = field(default=(), metadata=meta(
        "args appended to the following attempts; --key=value replaces an earlier --key"))
    skip_batches: int = field(default=0, metadata=meta(
        "batches the job should skip after resuming (TSUP_SKIP_BATCHES, resume_info())", min=0))
    scale: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}), metadata=meta(
        "multiply the value of a flag already in job.command, e.g. { \"--learning_rate\" = 0.5 } "
        "(--flag=v or --flag v; cumulative: two such rungs make x 0.25)"))


@dataclass(frozen=True)
class OnCause:
    action: Action | None = field(default=None, metadata=meta("restart | rollback | give_up | warn"))
    remedies: tuple[Remedy, ...] = field(default=(), metadata=meta(
        "applied one more each time the same cause repeats; when exhausted and it repeats: give up"))


def _diagnostics_default() -> Mapping[str, str]:
    return MappingProxyType({
        "NCCL_DEBUG": "INFO",
        "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
        "TORCH_SHOW_CPP_STACKTRACES": "1",
        "PYTHONFAULTHANDLER": "1",
    })


@dataclass(frozen=True)
class ValidationConfig:
    enabled: bool = field(default=True, metadata=meta("validate the first steps after every resume"))
    steps: int = field(default=20, metadata=meta(
        "training steps after a resume before the verdict, counted from the resume step whatever the logging "
        "interval (a job printing every 10 steps is judged at resume step + 20 with the default)", min=1))
    loss_tolerance: float = field(default=0.15, metadata=meta(
        "the first losses may differ from the loss recorded at the resumed step by this fraction",
        min=0))
    grad_norm_factor: float = field(default=3.0, metadata=meta(
        "grad norm must stay under the pre-reboot p99 times this", min=1))
    throughput_tolerance: float = field(default=0.2, metadata=meta(
        "throughput may be this fraction below the pre-reboot median", min=0, max=1))
    startup_factor: float = field(default=5.0, metadata=meta(
        "time to the first step may be this many times the earlier attempts' median", min=1))
    first_step_timeout_s: float = field(default=1800.0, metadata=meta(
        "the first step after a launch must come within this (else: hang)", min=0,
        min_exclusive=True))
    diagnostics_env: Mapping[str, str] = field(default_factory=_diagnostics_default, metadata=meta(
        "environment added after a failed validation, so the next attempt says more"))


def find_flag(argv: Sequence[str], flag: str) -> tuple[int, str] | None:
    """Where ``flag``'s value is in ``argv`` (``--flag=v`` or ``--flag v``): (index, value); the last wins."""
    found = None
    for i, a in enumerate(argv):
        if a.startswith(flag + "="):
            found = (i, a[len(flag) + 1:])
        elif a == flag and i + 1 < len(argv):
            found = (i + 1, argv[i + 1])
    return found


class JobSettings(Protocol):
    """What the core reads of ``[job]``: whether a resume adds args (the hand-over's words)."""

    @property
    def resume_args(self) -> tuple[str, ...]: ...


class RunSettings(Protocol):
    """What the core reads of the whole config (``config.model.Config`` is one): a structural
    type, so that the core names no concern's table. Read at each decision; replaced on reload."""

    @property
    def job(self) -> JobSettings: ...

    @property
    def policy(self) -> PolicyConfig: ...

    @property
    def shutdown(self) -> ShutdownConfig: ...

    def action_for(self, cause: Cause) -> Action: ...

    def action_configured(self, cause: Cause) -> bool: ...

    def remedies_for(self, cause: Cause) -> tuple[Remedy, ...]: ...
