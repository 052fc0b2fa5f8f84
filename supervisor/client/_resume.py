"""``resume_info()``: where this attempt resumes from, as the supervisor decided."""
from __future__ import annotations

import os
from dataclasses import dataclass

from ._env import ClientUsageError, env_int


@dataclass(frozen=True)
class ResumeInfo:
    """The supervisor's resume decision for this attempt.

    ``path``: checkpoint to load (``TSUP_RESUME_FROM``), None on a fresh start.
    ``step``: its step (``TSUP_RESUME_STEP``) when known. ``skip_batches``: batches to skip after
    loading, set by a rollback remedy (``TSUP_SKIP_BATCHES``; PaLM-style spike recovery).
    ``attempt``: 0 for the first launch (``TSUP_ATTEMPT``). ``run_id``: None outside supervision.
    """

    path: str | None
    step: int | None
    skip_batches: int
    attempt: int
    run_id: str | None
    checkpoint_dir: str | None

    @property
    def resuming(self) -> bool:
        return self.path is not None


def resume_info() -> ResumeInfo:
    """Read the resume decision from the environment. Outside supervision: a fresh start.

    Raises :class:`ClientUsageError` when a ``TSUP_*`` number is malformed.
    """
    skip = env_int("TSUP_SKIP_BATCHES", 0) or 0
    if skip < 0:
        raise ClientUsageError(f"environment variable TSUP_SKIP_BATCHES={skip} must be >= 0")
    return ResumeInfo(
        path=os.environ.get("TSUP_RESUME_FROM") or None,
        step=env_int("TSUP_RESUME_STEP", None),
        skip_batches=skip,
        attempt=env_int("TSUP_ATTEMPT", 0) or 0,
        run_id=os.environ.get("TSUP_RUN_ID") or None,
        checkpoint_dir=os.environ.get("TSUP_CHECKPOINT_DIR") or None,
    )
