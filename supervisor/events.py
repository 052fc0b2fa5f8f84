"""The data that flows between monitors, the policy and the runner.

Monitors *observe* and emit :class:`Detection` events; the pure policy maps (history, failure)
to a decision; only the runner acts ("detect != act", as NVIDIA's resiliency extension puts it).
Causes and actions, with what each one means, are defined in :mod:`supervisor.core.causes`
and re-exported here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Protocol, Sequence

from .core.causes import Action, Cause
from .redact import MAX_TOTAL_CHARS, MAX_VALUE_CHARS, redact_argv

__all__ = ["Action", "AttemptContext", "Cause", "Detection", "Emit", "LineSink", "MetricRecord", "MetricSink",
           "Monitor"]


def _now() -> float:
    return time.time()


@dataclass(frozen=True)
class Detection:
    """One anomaly seen by a monitor: what, where, since when, and the evidence.

    ``step`` is where it was seen; ``onset_step`` where the anomaly began (for a loss spike that
    persisted ``patience`` steps, the first step of the spike). Rollback selects a checkpoint
    taken before ``onset_step``.
    """

    cause: Cause
    summary: str  # one line for humans: "loss is nan at step 500"
    source: str  # "stdout", "stderr", "file:/path/rank0.log", "heartbeat", "nvml", "host", ...
    step: int | None = None
    onset_step: int | None = None
    value: float | None = None
    evidence: str | None = None  # the log line or reading, truncated to a few hundred chars
    details: Mapping[str, object] = field(default_factory=dict)
    # A monitor may know better than the per-cause default (Xid 79 -> give up: drain the node).
    suggested_action: Action | None = None
    at: float = field(default_factory=_now)  # wall-clock time of the observation


@dataclass(frozen=True)
class MetricRecord:
    """One training metric observation parsed from a log line or reported by the client."""

    step: int | None
    loss: float | None = None
    grad_norm: float | None = None
    lr: float | None = None
    tokens_per_sec: float | None = None
    val_loss: float | None = None
    rank: int | None = None
    source: str = ""
    fmt: str = ""  # which parser matched: json, hf, nanogpt, torchtitan, megatron, regex, client
    at: float = field(default_factory=_now)
    extra: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class AttemptContext:
    """What a monitor needs to know about the attempt it watches."""

    run_id: str
    attempt: int
    pgid: int
    pid: int
    started_monotonic: float
    state_dir: Path
    heartbeat_dir: Path
    checkpoint_dir: Path | None
    resume_from: str | None
    resume_step: int | None


Emit = Callable[[Detection], None]
MetricSink = Callable[[MetricRecord], None]


class LineSink(Protocol):
    """Receives the job's output, already split into complete lines (no trailing newline).

    Called from the pipe-reader threads with batches, so it must be fast and must never block
    for long; it must not raise (the caller guards it anyway and reports a failing sink once).
    ``source`` is ``"stdout"``, ``"stderr"`` or ``"file:<path>"``.
    """

    def feed(self, source: str, lines: Sequence[str]) -> None: ...


class Monitor(Protocol):
    """A watcher started for each attempt.

    ``start`` is called right after the job is spawned, ``poll`` from the main loop about every
    ``tick`` seconds (cheap: no blocking I/O longer than a few ms), ``stop`` when the attempt ends.
    A monitor that cannot see (file gone, NVML missing) emits that as an event through its
    status, never reports "healthy" by default. Exceptions are caught by the runner, logged once,
    and the monitor is marked failed; the daemon survives.
    """

    name: str

    def start(self, ctx: AttemptContext, emit: Emit) -> None: ...

    def poll(self, now: float) -> None: ...

    def stop(self) -> None: ...

    def status(self) -> Mapping[str, object]: ...


MAX_ARG_CHARS = MAX_VALUE_CHARS  # one argument as logged / stored
MAX_ARGV_CHARS = MAX_TOTAL_CHARS  # the whole argv as logged / stored (a 25 MB argv once made a 131 MB ledger)


def bounded_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` as we log and store it: each argument cut at MAX_ARG_CHARS and the list at
    MAX_ARGV_CHARS in all, each cut said in place (``…(+N chars)``, ``…(+N more args)``), and
    masked (supervisor.redact does both: the one place)."""
    return redact_argv(argv)  # shown and stored, never a --password=x or a URL's password
