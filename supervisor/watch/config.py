"""Config sections [heartbeat] and [detectors] (placeholder: filled by the watch work)."""
from __future__ import annotations
from dataclasses import dataclass

from ..configschema import meta


@dataclass(frozen=True)
class HeartbeatConfig:
    timeout_s: float | None = None


@dataclass(frozen=True)
class DetectorsConfig:
    pass
