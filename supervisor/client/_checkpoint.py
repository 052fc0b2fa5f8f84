"""Atomic checkpoint save with a manifest: ``save_checkpoint(obj, path, step=...)``.

torch is imported inside the function only: importing ``supervisor.client`` stays cheap and
torch-free. A reader (the supervisor, another rank, a resumed job) sees either the old file or
the complete new one, never a half-written file under the final name.
"""
from __future__ import annotations

import os
import platform
import socket
import sys
from pathlib import Path
from typing import Any, Mapping

from ..checkpoints.hashing import file_digest
from ..checkpoints.manifest import (
    FORMAT,
    config_hash,
    fsync_dir,
    manifest_path,
    normalize_metrics,
    utc_now_iso,
    write_json_atomic,
)

__all__ = ["save_checkpoint"]


def _environment(seed: Any) -> dict[str, Any]:
    import torch  # already imported by the caller's torch.save; cheap here

    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": getattr(torch.version, "cuda", None),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "pid": os.getpid(),
    }
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "PYTHONHASHSEED",
                "TSUP_RUN_ID", "TSUP_ATTEMPT", "TSUP_RESUME_FROM"):
        if var in os.environ:
            env[var] = os.environ[var]
    if seed is not None:
        env["seed"] = seed
    return env


def save_checkpoint(
    obj: Any,
    path: str | os.PathLike[str],
    *,
    step: int,
    config: Mapping[str, Any] | None = None,
    metrics: Mapping[str, Any] | None = None,
    seed: int | Mapping[str, int] | None = None,
) -> Path:
    """Save ``obj`` with ``torch.save`` atomically and write ``<path>.manifest.json`` beside it.

    ``metrics`` maps a name to a value (taken at ``step``), to ``(value, step)``, or to
    ``{"value": v, "step": s}``: e.g. ``{"val_loss": 2.1}``. Returns the final path.
    Raises TypeError/ValueError at once on misuse (before anything is written).
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise TypeError(f"save_checkpoint: step must be a non-negative int, got {step!r}")
    if config is not None and not isinstance(config, Mapping):
        raise TypeError(f"save_checkpoint: config must be a mapping (e.g. vars(args)), got {type(config).__name__}")
    norm_metrics = normalize_metrics(metrics, step)
    import torch

    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    # Same dir as the target so the rename is atomic; a dot + .tmp name so watchers skip it.
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        size = tmp.stat().st_size
        digest = file_digest(tmp, "sha256")  # fresh in the page cache: a fast re-read
        os.replace(tmp, final)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    fsync_dir(final.parent)
    cfg = dict(config) if config is not None else None
    write_json_atomic(manifest_path(final), {
        "format": FORMAT,
        "origin": "client",
        "path": final.name,
        "kind": "file",
        "sha256": digest,
        "size": size,
        "step": step,
        "config": cfg,
        "config_sha256": config_hash(cfg) if cfg is not None else None,
        "metrics": norm_metrics,
        "environment": _environment(seed),
        "created_at": utc_now_iso(),
    })
    return final
