"""A checkpoint against its manifest: does it still match (size, then digest, per file for a
folder), and the manifest the supervisor writes for a checkpoint that came without one."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

import structlog

from .manifest import (
    Manifest,
    fallback_manifest_path,
    manifest_path,
    read_manifest,
    stat_record,
    supervisor_manifest,
    write_json_atomic,
)
from .quicklist import RowBuilder

log = structlog.get_logger("supervisor.checkpoints")

# (path, algorithm) -> (digest, per-file digests for a folder or None); may raise OSError/ValueError
Digest = Callable[[Path, str], tuple[str, "dict[str, Any] | None"]]


def stat_changed(recorded: Mapping[str, Any], now: Mapping[str, int]) -> bool:
    """A supervisor manifest's stat no longer matches: the job rewrote the checkpoint since."""
    return recorded.get("size") != now.get("size") or recorded.get("mtime_ns") != now.get("mtime_ns")


def check_integrity(row: RowBuilder, manifest: Manifest, preferred_alg: str, digest: Digest) -> None:
    """Fill ``row.complete`` / ``row.sha256_ok`` and its reasons from ``manifest``."""
    path = row.path
    st = stat_record(path)
    if manifest.size is not None and manifest.size != st["size"]:
        row.complete = False
        what = "truncated" if st["size"] < manifest.size else "larger than saved"
        row.no(f"{what}: {st['size']} bytes, the manifest says {manifest.size}")
        row.sha256_ok = False
        return
    alg = preferred_alg if preferred_alg in manifest.digests else (
        "sha256" if "sha256" in manifest.digests else next(iter(manifest.digests), None))
    if alg is None:
        row.notes.append("manifest has no digest: integrity not checked")
        return
    try:
        got, files = digest(path, alg)
    except (OSError, ValueError) as exc:
        row.sha256_ok = None
        row.no(f"cannot hash the checkpoint: {exc}")
        return
    row.sha256_ok = got == manifest.digests[alg]
    if not row.sha256_ok:
        detail = ""
        if files is not None and manifest.files:
            changed = [k for k in sorted(set(files) | set(manifest.files))
                       if (files.get(k) or {}).get(alg) != (manifest.files.get(k) or {}).get(alg)]
            detail = f" (files differing: {', '.join(changed[:5])})"
        row.no(f"{alg} mismatch: the checkpoint changed or is corrupt since its manifest was written"
               f"{detail}; manifest {manifest.digests[alg][:12]}, file {got[:12]}")


def write_own_manifest(path: Path, layout: str, step: int | None, config: Any, alg: str, digest: Digest,
                       state_dir: Path) -> Manifest | None:
    """Hash ``path`` and write an ``origin: supervisor`` manifest beside it (in ``state_dir`` when
    the checkpoint dir is not writable); None when it changed while hashing or cannot be written.
    A manifest the job wrote meanwhile wins and is returned instead."""
    try:
        st = stat_record(path)
        got, files = digest(path, alg)
        if stat_record(path) != st:
            return None  # changed while hashing: not settled after all; next time
    except OSError:
        return None
    data = supervisor_manifest(path, digests={alg: got}, size=st["size"], step=step, files=files,
                               config=config, stat=st, layout=layout)
    target = manifest_path(path)
    try:
        theirs = read_manifest(path, state_dir).manifest if target.exists() else None
        if theirs is not None and theirs.origin != "supervisor":
            return theirs  # the job wrote one meanwhile: it wins
        write_json_atomic(target, data)
    except OSError as exc:
        target = fallback_manifest_path(state_dir, path)
        log.info("checkpoint_manifest_fallback", path=str(path), error=str(exc), fallback=str(target),
                 next="the manifest is kept in the state dir instead")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(target, data)
        except OSError:
            return None
    log.info("checkpoint_manifest_written", path=str(path), manifest=str(target), step=step, origin="supervisor")
    return read_manifest(path, state_dir).manifest
