"""Atomic checkpoint save with a manifest: ``save_checkpoint(obj, path, step=...)``; and
``record_checkpoint(path, step=...)``: the same manifest for a checkpoint something else wrote
(a trainer's ``checkpoint-500/`` folder, a Lightning ``.ckpt`` file).

torch is imported inside the function only: importing ``supervisor.client`` stays cheap and
torch-free. A reader (the supervisor, another rank, a resumed job) sees either the old file or
the complete new one, never a half-written file under the final name.
"""
from __future__ import annotations

import collections
import json
import os
import platform
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from ..checkpoints.hashing import DigestCache, file_digest, tree_digest
from ..checkpoints.manifest import (
    FORMAT,
    MANIFEST_SUFFIX,
    config_hash,
    fsync_dir,
    manifest_path,
    normalize_metrics,
    stat_record,
    utc_now_iso,
    write_json_atomic,
)
from ._env import warn

__all__ = ["record_checkpoint", "save_checkpoint"]


def _environment(seed: Any) -> dict[str, Any]:
    try:
        import torch  # already imported by the caller's torch.save (or its trainer); cheap here
    except ImportError:  # record_checkpoint of a checkpoint written without torch
        torch = None

    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "torch": getattr(torch, "__version__", None),
        "cuda": getattr(getattr(torch, "version", None), "cuda", None),
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


def _check_args(fn: str, step: object, config: object) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise TypeError(f"{fn}: step must be a non-negative int, got {step!r}")
    if config is not None and not isinstance(config, Mapping):
        raise TypeError(f"{fn}: config must be a mapping (e.g. vars(args)), got {type(config).__name__}")


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
    _check_args("save_checkpoint", step, config)
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
    write_json_atomic(manifest_path(final), _manifest(final, "file", digest, size, None, step, cfg, norm_metrics, seed))
    return final


def _manifest(target: Path, kind: str, digest: str, size: int, files: dict[str, Any] | None, step: int,
              cfg: dict[str, Any] | None, norm_metrics: dict[str, Any], seed: Any) -> dict[str, Any]:
    """The client's manifest (``origin: client``); ``files``: a folder's per-file digests."""
    data: dict[str, Any] = {
        "format": FORMAT,
        "origin": "client",
        "path": target.name,
        "kind": kind,
        "sha256": digest,
        "size": size,
        "step": step,
        "config": cfg,
        "config_sha256": config_hash(cfg) if cfg is not None else None,
        "metrics": norm_metrics,
        "environment": _environment(seed),
        "created_at": utc_now_iso(),
    }
    if files is not None:
        data["files"] = files
    return data


# -- recording a checkpoint written by someone else ---------------------------------------------

def record_checkpoint(
    path: str | os.PathLike[str],
    *,
    step: int,
    config: Mapping[str, Any] | None = None,
    metrics: Mapping[str, Any] | None = None,
    seed: int | Mapping[str, int] | None = None,
    background: bool = False,
) -> Path:
    """Write ``<path>.manifest.json`` for a complete checkpoint the job's trainer wrote itself.

    ``path`` is a file (``epoch=0-step=500.ckpt``) or a folder (``checkpoint-500/``); the manifest
    is the one :func:`save_checkpoint` writes (``origin: client``, sha256, size, step, metrics;
    a folder also gets per-file digests, as the supervisor computes them), so the supervisor
    verifies the checkpoint against it and takes the step and metrics from it. Call it only once
    the checkpoint is complete. ``background=True`` hashes in a worker thread (records run one at
    a time, in order; the interpreter waits for them at exit) so a large folder does not stall
    training. Returns the manifest's path. Raises TypeError/ValueError at once on misuse,
    FileNotFoundError when ``path`` does not exist, and (not in the background) RuntimeError when
    the checkpoint changed while it was hashed: it was not complete yet.
    """
    _check_args("record_checkpoint", step, config)
    norm_metrics = normalize_metrics(metrics, step)
    target = Path(path)
    if not target.exists():
        raise FileNotFoundError(f"record_checkpoint: {target} does not exist (record a checkpoint after saving it)")
    cfg = dict(config) if config is not None else None
    if background:
        _enqueue(lambda: _record_quietly(target, step, cfg, norm_metrics, seed))
    elif not _record(target, step, cfg, norm_metrics, seed):
        raise RuntimeError(f"record_checkpoint: {target} changed while it was hashed; record it once it is complete")
    return manifest_path(target)


def _record(target: Path, step: int, cfg: dict[str, Any] | None, norm_metrics: dict[str, Any], seed: Any) -> bool:
    """Hash ``target`` and write its manifest; False (nothing written) when it changed meanwhile."""
    before = stat_record(target)
    if target.is_dir():
        digest, files = tree_digest(target, DigestCache(None), "sha256")
        kind = "dir"
    else:
        digest, files, kind = file_digest(target, "sha256"), None, "file"
    if stat_record(target) != before:
        return False  # rewritten while hashing: the supervisor will hash what it finds
    write_json_atomic(manifest_path(target),
                      _manifest(target, kind, digest, before["size"], files, step, cfg, norm_metrics, seed))
    return True


def _record_quietly(target: Path, step: int, cfg: dict[str, Any] | None, norm_metrics: dict[str, Any],
                    seed: Any) -> None:
    # A background record never raises into training; a checkpoint deleted meanwhile (a trainer's
    # rotation) is simply not recorded, and the supervisor writes its own manifest for the rest.
    try:
        if not _record(target, step, cfg, norm_metrics, seed):
            print(f"supervisor.client: {target} changed while it was hashed; no manifest written "
                  "(the supervisor will verify it itself)", file=sys.stderr)
    except FileNotFoundError:
        pass
    except Exception as exc:  # reported, never fatal
        if target.exists():
            print(f"supervisor.client: cannot write the manifest of {target}: {exc}", file=sys.stderr)


_bg_lock = threading.Lock()
_bg_jobs: collections.deque[Callable[[], None]] = collections.deque()
_bg_worker: threading.Thread | None = None


def _enqueue(job: Callable[[], None]) -> None:
    global _bg_worker
    with _bg_lock:
        _bg_jobs.append(job)
        if _bg_worker is None:
            # Not a daemon thread: the interpreter waits for pending manifests before it exits.
            _bg_worker = threading.Thread(target=_drain, name="tsup-record-checkpoint", daemon=False)
            _bg_worker.start()


def _drain() -> None:
    global _bg_worker
    while True:
        with _bg_lock:
            if not _bg_jobs:
                _bg_worker = None
                return
            job = _bg_jobs.popleft()
        job()


def _wait_recorded(timeout: float | None = None) -> bool:
    """Wait for background records to finish; True when none is pending."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        with _bg_lock:
            worker = _bg_worker
        if worker is None:
            return True
        worker.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if worker.is_alive():
            return False


def _prune_orphan_manifests(directory: Path, names: Callable[[str], bool]) -> None:
    """Remove the client's manifests whose checkpoint is gone (a trainer's rotation deleted it).

    Only manifests with ``origin: client`` and a checkpoint name ``names`` accepts; errors are ignored.
    """
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for e in entries:
        if not e.name.endswith(MANIFEST_SUFFIX):
            continue
        ckpt = e.name[: -len(MANIFEST_SUFFIX)]
        if not names(ckpt) or os.path.lexists(os.path.join(directory, ckpt)):
            continue
        try:
            with open(e.path) as f:
                if json.load(f).get("origin") != "client":
                    continue
            os.unlink(e.path)
        except (OSError, ValueError, AttributeError):
            continue


def record_trainer_save(path: Path, *, step: int, last: Mapping[str, tuple[float, int]], config: Any,
                        background: bool, siblings: Callable[[str], bool]) -> None:
    """A trainer callback saw its trainer save ``path``: write its manifest with the last metrics
    (``last``: name -> (value, step)), never raising into the training loop, then drop the
    manifests of checkpoints the trainer has rotated away (names ``siblings`` accepts)."""
    metrics = {name: {"value": v, "step": s} for name, (v, s) in last.items()}
    try:
        record_checkpoint(path, step=step, metrics=metrics, config=config, background=background)
    except (OSError, ValueError, TypeError, RuntimeError) as exc:
        warn(f"cannot write the manifest of {path}: {exc}")
    _prune_orphan_manifests(path.parent, siblings)
