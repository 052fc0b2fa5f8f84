"""Config section [checkpoints] (placeholder: filled by the checkpoint work)."""
from __future__ import annotations
from dataclasses import dataclass

from ..configschema import meta


@dataclass(frozen=True)
class CheckpointsConfig:
    dir: str | None = None
