"""What the monitors observe, as the core takes it: a detection and a metric record.

Each carries the wall-clock time of its observation as a required field: the producer stamps it
with its own clock (a parser when it reads the line, a monitor when it polls, the machine with
its event's time), so no value is dated by whoever happens to build it, and the core reads no
clock of its own."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from .causes import Action, Cause


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
    at: float = field(kw_only=True)  # wall-clock time of the observation (required: no clock here)


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
    extra: Mapping[str, float] = field(default_factory=dict)
    at: float = field(kw_only=True)  # wall-clock time of the observation (required: no clock here)
