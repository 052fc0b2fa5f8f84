"""Config sections [gpu] and [host] (placeholder: filled by the health work)."""
from __future__ import annotations
from dataclasses import dataclass

from ..configschema import meta


@dataclass(frozen=True)
class GpuConfig:
    pass


@dataclass(frozen=True)
class HostConfig:
    pass
