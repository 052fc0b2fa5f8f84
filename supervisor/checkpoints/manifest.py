"""Checkpoint manifests: the JSON file beside each checkpoint that ties it to its config and run.

``<checkpoint>.manifest.json`` for a file, ``<folder>.manifest.json`` beside a folder. The client
library (``supervisor.client.save_checkpoint``) writes one with every save; for checkpoints that
come without one, the supervisor writes its own (``"origin": "supervisor"``) the first time it
sees the checkpoint complete, never touching the checkpoint itself. Reading never raises: a
manifest that is missing or malformed comes back with a reason the quicklist can print.
"""
from __future__ import annotations

import datetime as _dt
import errno
import hashlib
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping
from .. import strictjson

MANIFEST_SUFFIX = ".manifest.json"
#: The largest manifest read: one is a few hundred bytes (a few KiB with a folder's per-file
#: digests); a bigger file beside a checkpoint is not one of ours, and is not read into memory.
MAX_MANIFEST_BYTES = 1 << 20
FORMAT = "tsup-checkpoint-manifest/1"


def manifest_path(checkpoint: Path) -> Path:
    return checkpoint.with_name(checkpoint.name + MANIFEST_SUFFIX)


def is_manifest(path: Path) -> bool:
    return path.name.endswith(MANIFEST_SUFFIX)


def utc_now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def config_hash(config: Any) -> str:
    """A stable hash of a config snapshot (sorted keys; non-JSON values by their str())."""
    blob = json.dumps(config, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def normalize_metrics(metrics: Mapping[str, Any] | None, step: int | None) -> dict[str, dict[str, Any]]:
    """``{name: value}``, ``{name: (value, step)}`` or ``{name: {value, step}}`` -> ``{name: {value, step}}``."""
    out: dict[str, dict[str, Any]] = {}
    for name, v in (metrics or {}).items():
        if isinstance(v, Mapping):
            if "value" not in v:
                raise ValueError(f"metric {name!r}: a mapping needs a 'value' (and optionally 'step')")
            out[str(name)] = {"value": float(v["value"]), "step": v.get("step", step)}
        elif isinstance(v, (tuple, list)):
            if len(v) != 2:
                raise ValueError(f"metric {name!r}: expected (value, step), got {v!r}")
            out[str(name)] = {"value": float(v[0]), "step": int(v[1])}
        else:
            out[str(name)] = {"value": float(v), "step": step}
    return out


@dataclass(frozen=True)
class Manifest:
    """A validated manifest. ``raw`` keeps every field, including ones added later."""

    path: Path
    origin: str  # "client" | "supervisor"
    step: int | None
    size: int | None
    digests: Mapping[str, str]  # algorithm -> hex digest (sha256 and/or blake3)
    files: Mapping[str, Mapping[str, Any]] | None  # folder checkpoints: relpath -> {size, <alg>}
    config: Any
    config_sha256: str | None
    metrics: Mapping[str, Mapping[str, Any]]
    environment: Mapping[str, Any]
    created_at: str | None
    stat: Mapping[str, int] | None  # supervisor manifests: the stat it was made from
    raw: Mapping[str, Any] = field(repr=False, default_factory=dict)


@dataclass(frozen=True)
class ManifestRead:
    manifest: Manifest | None
    problem: str | None  # None when absent and fine to be absent; a reason when unusable
    present: bool


def _opt_int(d: Mapping[str, Any], key: str, problems: list[str]) -> int | None:
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        problems.append(f"{key} is not an integer ({v!r})")
        return None
    return v


def parse_manifest(path: Path, data: Any) -> tuple[Manifest | None, str | None]:
    if not isinstance(data, dict):
        return None, f"manifest {path.name} is not a JSON object"
    problems: list[str] = []
    step = _opt_int(data, "step", problems)
    size = _opt_int(data, "size", problems)
    digests = {alg: data[alg] for alg in ("sha256", "blake3") if isinstance(data.get(alg), str)}
    for alg in ("sha256", "blake3"):
        if alg in data and alg not in digests:
            problems.append(f"{alg} is not a string")
    metrics_raw = data.get("metrics") or {}
    metrics: dict[str, Mapping[str, Any]] = {}
    if not isinstance(metrics_raw, dict):
        problems.append("metrics is not an object")
    else:
        for name, m in metrics_raw.items():
            # A non-finite value is written as "NaN"/"Infinity" (strictjson); older files hold bare NaN.
            v = strictjson.number(m.get("value") if isinstance(m, dict) else m)
            if isinstance(m, dict) and isinstance(v, (int, float)) and not isinstance(v, bool):
                metrics[name] = {"value": float(v), "step": m.get("step")}
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                metrics[name] = {"value": float(v), "step": step}
            else:
                problems.append(f"metric {name!r} has no numeric value")
    files = data.get("files")
    if files is not None and not isinstance(files, dict):
        problems.append("files is not an object")
        files = None
    env = data.get("environment") or {}
    stat = data.get("stat")
    if problems:
        return None, f"manifest {path.name} is invalid: " + "; ".join(problems)
    return Manifest(
        path=path, origin=str(data.get("origin", "client")), step=step, size=size, digests=digests,
        files=files, config=data.get("config"), config_sha256=data.get("config_sha256"),
        metrics=metrics, environment=env if isinstance(env, dict) else {},
        created_at=data.get("created_at"), stat=stat if isinstance(stat, dict) else None, raw=data,
    ), None


def read_capped(path: Path, limit: int) -> bytes | None:
    """A small file the job controls, whole, or None when it is larger than ``limit`` (at most
    ``limit`` + 1 bytes are read). Opened without blocking and only when it is a regular file: a
    FIFO or a device put in its place raises OSError instead of hanging the reader."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        chunks, got = [], 0
        while got <= limit and (chunk := os.read(fd, limit + 1 - got)):
            chunks.append(chunk)
            got += len(chunk)
    finally:
        os.close(fd)
    return None if got > limit else b"".join(chunks)


def read_manifest(checkpoint: Path, fallback_dir: Path | None = None) -> ManifestRead:
    """The manifest of ``checkpoint`` (beside it, else in ``fallback_dir``); never raises."""
    candidates = [manifest_path(checkpoint)]
    if fallback_dir is not None:
        candidates.append(fallback_manifest_path(fallback_dir, checkpoint))
    for mp in candidates:
        try:
            raw = read_capped(mp, MAX_MANIFEST_BYTES)
        except FileNotFoundError:
            continue
        except OSError as exc:
            return ManifestRead(None, f"manifest {mp.name} unreadable: {exc.strerror or exc}", True)
        if raw is None:
            return ManifestRead(None, f"manifest {mp.name} is larger than {MAX_MANIFEST_BYTES} bytes: not read", True)
        try:
            data = json.loads(raw)
        except ValueError as exc:
            return ManifestRead(None, f"manifest {mp.name} is not valid JSON ({exc})", True)
        m, problem = parse_manifest(mp, data)
        return ManifestRead(m, problem, True)
    return ManifestRead(None, None, False)


def record_metric(manifest: Manifest, name: str, value: float, step: int) -> None:
    """Add ``name`` = ``value`` (printed at ``step``) to a manifest the supervisor wrote (rewritten
    atomically where it was read). A failed write is logged: the metric is then missing, nothing else."""
    data = dict(manifest.raw)
    data["metrics"] = {**(data.get("metrics") or {}), name: {"value": float(value), "step": step}}
    try:
        write_json_atomic(manifest.path, data)
    except OSError as exc:
        import structlog

        structlog.get_logger("supervisor.checkpoints").info(
            "checkpoint_manifest_metric_not_written", manifest=str(manifest.path), error=str(exc),
            next="the listing shows no validation metric for this version")


def fallback_manifest_path(state_dir: Path, checkpoint: Path) -> Path:
    """Where the supervisor keeps a manifest when the checkpoint dir is not writable."""
    tag = hashlib.sha256(str(checkpoint.resolve()).encode()).hexdigest()[:16]
    return state_dir / "manifests" / f"{checkpoint.name}.{tag}{MANIFEST_SUFFIX}"


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """Write JSON via a temp file in the same dir, fsync, rename, fsync the dir."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        strictjson.dump(data, f, indent=2, sort_keys=True, default=str)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return  # some filesystems do not allow opening a dir; the rename is still done
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def stat_record(checkpoint: Path) -> dict[str, int]:
    """Size and newest mtime of a file or folder tree; a change means the checkpoint was rewritten."""
    if checkpoint.is_dir():
        size, mtime, count = 0, checkpoint.stat().st_mtime_ns, 0
        for root, _dirs, files in os.walk(checkpoint):
            for name in files:
                st = os.stat(os.path.join(root, name))
                size += st.st_size
                mtime = max(mtime, st.st_mtime_ns)
                count += 1
        return {"size": size, "mtime_ns": mtime, "files": count}
    st = checkpoint.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}


def supervisor_manifest(
    checkpoint: Path,
    *,
    digests: Mapping[str, str],
    size: int,
    step: int | None,
    files: Mapping[str, Any] | None,
    config: Any,
    stat: Mapping[str, int],
    layout: str,
) -> dict[str, Any]:
    """The manifest the supervisor writes for a checkpoint that came without one."""
    import platform
    import socket
    import sys

    return {
        "format": FORMAT,
        "origin": "supervisor",
        "path": checkpoint.name,
        "kind": "dir" if checkpoint.is_dir() else "file",
        "layout": layout,
        **dict(digests),
        "size": size,
        "files": dict(files) if files is not None else None,
        "step": step,
        # The config the current job runs with when the checkpoint was first seen complete: the
        # best available guess of what it was saved with (the job that wrote it is the one running).
        "config": config,
        "config_sha256": config_hash(config) if config is not None else None,
        "metrics": {},
        "environment": {"hostname": socket.gethostname(), "supervisor_python": sys.version.split()[0],
                        "platform": platform.platform()},
        "stat": dict(stat),
        "created_at": utc_now_iso(),
    }
