"""Streaming digests of checkpoint files and folders, cached by (dev, inode, size, mtime_ns).

A 1 GB checkpoint is read once per change, not once per restart: the cache key changes whenever
the file is rewritten (a rename gives a new inode, an in-place write a new mtime). Reads go
through one preallocated 1 MiB buffer with ``readinto`` (no per-chunk allocation) and hashlib
releases the GIL on large updates, so hashing from a worker thread does not stall the main loop.
1 MiB hashes as fast as 8 did; an 8 MiB block per digest was memory the daemon's malloc kept.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog
from ..regularfile import read_regular_text

log = structlog.get_logger("supervisor.checkpoints")

BUFFER_BYTES = 1024 * 1024
ALGORITHMS = ("sha256", "blake3")


class _Hasher(Protocol):
    def update(self, data: bytes | memoryview, /) -> Any: ...

    def hexdigest(self) -> str: ...


def blake3_available() -> bool:
    try:
        import blake3  # noqa: F401
    except ImportError:
        return False
    return True


def new_hasher(algorithm: str) -> _Hasher:
    """A fresh hasher; raises ValueError for an unknown or unavailable algorithm."""
    if algorithm == "sha256":
        return hashlib.sha256()
    if algorithm == "blake3":
        try:
            import blake3
        except ImportError as exc:
            raise ValueError("hash algorithm blake3 needs the blake3 package (pip install blake3)") from exc
        # max_threads lets blake3 use every core on large buffers: its main speed advantage.
        return blake3.blake3(max_threads=blake3.blake3.AUTO)
    raise ValueError(f"unknown hash algorithm {algorithm!r} (expected one of {', '.join(ALGORITHMS)})")


#: ``callback(path, bytes_done, bytes_total)`` while a file is hashed (None: nobody listens).
ProgressCallback = Callable[[Path, int, int], None]
_progress: ProgressCallback | None = None


@contextmanager
def progress(callback: ProgressCallback | None) -> Iterator[None]:
    """Report hashing progress to ``callback`` inside the block, after every buffer read and once
    at the end (``bytes_done == bytes_total``); the ``checkpoints`` verb shows it on stderr."""
    global _progress
    previous, _progress = _progress, callback
    try:
        yield
    finally:
        _progress = previous


def file_digest(path: str | os.PathLike[str], algorithm: str = "sha256", buffer_bytes: int = BUFFER_BYTES) -> str:
    """Hex digest of one file, streamed with a reused buffer."""
    h = new_hasher(algorithm)
    buf = bytearray(buffer_bytes)
    view = memoryview(buf)
    cb = _progress
    with open(path, "rb", buffering=0) as f:
        total = os.fstat(f.fileno()).st_size if cb is not None else 0
        done = 0
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(view[:n])
            if cb is not None:
                done += n
                cb(Path(path), done, total)
    if cb is not None and done == 0:
        cb(Path(path), 0, 0)
    return h.hexdigest()


@dataclass(frozen=True)
class StatKey:
    dev: int
    inode: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: Path) -> "StatKey":
        st = path.stat()
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def token(self, algorithm: str) -> str:
        return f"{algorithm}:{self.dev}:{self.inode}:{self.size}:{self.mtime_ns}"


class DigestCache:
    """Digests keyed by stat, persisted as a small JSON file in the state dir (thread-safe).

    ``cache_file=None`` keeps it in memory only (a read-only CLI, tests). A cache that cannot be
    read is started afresh (it is only a cache); one that cannot be written is logged once.
    """

    MAX_ENTRIES = 4096

    def __init__(self, cache_file: Path | None) -> None:
        self._file = cache_file
        self._lock = threading.Lock()
        self._entries: dict[str, str] = {}
        self._warned = False
        if cache_file is not None and cache_file.exists():
            try:
                data = json.loads(read_regular_text(cache_file, "a digest cache"))  # no FIFO, no link
                if isinstance(data, dict):
                    self._entries = {str(k): str(v) for k, v in data.items()}
            except (OSError, ValueError) as exc:
                log.warning("digest_cache_unreadable", path=str(cache_file), error=str(exc),
                            next="starting with an empty cache; checkpoints will be hashed again")

    def digest(self, path: Path, algorithm: str = "sha256") -> str:
        """Digest of ``path``, from the cache when its stat key has not changed."""
        key = StatKey.of(path).token(algorithm)
        with self._lock:
            hit = self._entries.get(key)
        if hit is not None:
            return hit
        value = file_digest(path, algorithm)
        # Only trust the digest if the file did not change while we read it.
        if StatKey.of(path).token(algorithm) == key:
            with self._lock:
                self._entries[key] = value
                if len(self._entries) > self.MAX_ENTRIES:
                    for old in list(self._entries)[: len(self._entries) - self.MAX_ENTRIES]:
                        del self._entries[old]
                self._save_locked()
        return value

    def _save_locked(self) -> None:
        if self._file is None:
            return
        tmp = self._file.with_name(f".{self._file.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            self._file.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(self._entries))
            os.replace(tmp, self._file)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning("digest_cache_unwritable", path=str(self._file), error=str(exc),
                            next="digests stay cached in memory only")


def tree_files(folder: Path) -> list[Path]:
    """Regular files under ``folder`` in a stable order (symlinks are not followed)."""
    out: list[Path] = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            p = Path(root) / name
            if p.is_file() and not p.is_symlink():
                out.append(p)
    return out


def tree_digest(folder: Path, cache: DigestCache, algorithm: str = "sha256") -> tuple[str, dict[str, dict[str, Any]]]:
    """A folder's digest (over 'relpath size digest' lines) and its per-file entries."""
    files: dict[str, dict[str, Any]] = {}
    h = new_hasher(algorithm)
    for p in tree_files(folder):
        rel = p.relative_to(folder).as_posix()
        d = cache.digest(p, algorithm)
        size = p.stat().st_size
        files[rel] = {"size": size, algorithm: d}
        h.update(f"{rel}\0{size}\0{d}\n".encode())
    return h.hexdigest(), files
