"""Config sections [metrics] and [systemd] (placeholder: filled by the ops work)."""
from __future__ import annotations
from dataclasses import dataclass

from ..configschema import meta


@dataclass(frozen=True)
class MetricsConfig:
    listen: str | None = None


@dataclass(frozen=True)
class SystemdConfig:
    pass
