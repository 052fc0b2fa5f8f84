"""Does a checkpoint still match its manifest: size, then digest (per file for a folder)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from .manifest import Manifest, stat_record
from .quicklist import RowBuilder

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
