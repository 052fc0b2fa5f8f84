"""The monitors' side of the flow: what a monitor is told (AttemptContext), what it is given to
emit into (Emit, MetricSink, LineSink), and the Monitor interface.

Monitors *observe* and emit detections (:mod:`supervisor.core.observations`, the core's data);
the pure policy maps (history, failure) to a decision; only the runner acts ("detect != act", as
NVIDIA's resiliency extension puts it). Causes and actions, with what each one means, are defined
in :mod:`supervisor.core.causes` and re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Protocol, Sequence

from .core.causes import Action, Cause
from .core.observations import Detection, MetricRecord

__all__ = ["Action", "AttemptContext", "Cause", "Emit", "LineSink", "MetricSink", "Monitor"]


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


