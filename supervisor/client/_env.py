"""Reading the supervisor's environment once (``TSUP_*``, the rank), with clear errors."""
from __future__ import annotations

import os
import sys


class ClientUsageError(ValueError):
    """Raised when ``supervisor.client`` is called wrongly or the environment is malformed.

    The message names the call or variable and what was expected; fix the training script (or the
    variable) and run again. Raised immediately, so the mistake shows on the first step, not at
    the first failure hours later.
    """


def warn(message: str) -> None:
    """One line to the job's stderr, where the supervisor's log and the user both see it."""
    print(f"supervisor.client: {message}", file=sys.stderr, flush=True)


def supervised() -> bool:
    """True when running under transformer-supervisor (``TSUP_RUN_ID`` is set)."""
    return bool(os.environ.get("TSUP_RUN_ID"))


def env_int(name: str, default: int | None) -> int | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ClientUsageError(f"environment variable {name}={raw!r} is not an integer") from None


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ClientUsageError(f"environment variable {name}={raw!r} is not a number") from None
    if not value >= 0:
        raise ClientUsageError(f"environment variable {name}={raw!r} must be a non-negative number")
    return value


#: where the rank comes from, first found wins: torchrun/torch.distributed, Slurm's srun (a task per
#: rank: ``srun --ntasks-per-node=8 python train.py``), then the local ranks of both. Inside
#: ``srun torchrun ...`` torchrun's RANK wins over SLURM_PROCID (which numbers the nodes' tasks).
RANK_VARIABLES = ("RANK", "SLURM_PROCID", "LOCAL_RANK", "SLURM_LOCALID")


def rank() -> int:
    """This process's global rank: ``RANK``, else ``SLURM_PROCID``, else ``LOCAL_RANK``, else
    ``SLURM_LOCALID``, else 0."""
    for name in RANK_VARIABLES:
        r = env_int(name, None)
        if r is not None:
            return r
    return 0


def heartbeat_path(directory: str, rk: int) -> str:
    return os.path.join(directory, f"heartbeat-rank{rk}.json")


def metrics_path(directory: str, rk: int) -> str:
    return os.path.join(directory, f"metrics-rank{rk}.jsonl")
