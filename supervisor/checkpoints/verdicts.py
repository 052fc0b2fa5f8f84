"""Load-test verdicts persisted in the state dir (``STATE/checkpoint_loadtests.json``), so the
``checkpoints`` verb and a restarted daemon reuse what a load test already found.

Keyed by what makes a verdict true: the path, the version on disk (dev, inode, size, mtime_ns)
and its ctime_ns (any write changes it, also one that puts the mtime back, as bit rot tests
do; ``utime`` cannot set it), whether every tensor was checked finite, and the test's settings
and interpreter (other expected keys or another torch may answer otherwise). Not by digest:
hashing a large file to look up a cache would cost what the cache saves. Files only: a folder's
ctime does not change when a file in it is rewritten, so folders are tested again. Only a cache: unreadable -> started afresh, unwritable -> logged
once; a verdict is never the only record of anything.
"""
from __future__ import annotations

import json
import os
import stat
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any

import structlog

from .loadtest import LoadTestResult
from ..regularfile import read_regular_text

log = structlog.get_logger("supervisor.checkpoints")

FILE_NAME = "checkpoint_loadtests.json"
MAX_ENTRIES = 4096


def _key(path: Path | str, token: Any, checked: bool, settings: str) -> str | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return json.dumps([str(path), str(token), st.st_ctime_ns, bool(checked), settings])


class VerdictStore:
    """Thread-safe; ``file=None`` keeps nothing (no state dir)."""

    def __init__(self, file: Path | None, settings: str) -> None:
        self._file, self._settings = file, settings
        self._lock = threading.Lock()
        self._entries: dict[str, dict[str, Any]] = {}
        self._warned = False
        if file is not None and file.exists():
            try:
                data = json.loads(read_regular_text(file, "a load-test cache"))  # no FIFO, no link
                if isinstance(data, dict):
                    self._entries = {str(k): v for k, v in data.items() if isinstance(v, dict)}
            except (OSError, ValueError) as exc:
                log.warning("loadtest_cache_unreadable", path=str(file), error=str(exc),
                            next="starting with an empty cache; checkpoints will be load-tested again")

    def get(self, path: Path | str, token: Any, checked: bool) -> LoadTestResult | None:
        key = _key(path, token, checked, self._settings) if self._file is not None else None
        if key is None:
            return None
        with self._lock:
            v = self._entries.get(key)
        if v is None:
            return None
        try:
            return LoadTestResult(**{**v, "keys": tuple(v.get("keys") or ()),
                                     "nonfinite": tuple(v.get("nonfinite") or ()), "notes": tuple(v.get("notes") or ()),
                                     "weights_only": tuple(v.get("weights_only") or ())})
        except TypeError:  # written by another version: ignored, the test runs again
            return None

    def put(self, path: Path | str, token: Any, checked: bool, res: LoadTestResult) -> None:
        key = _key(path, token, checked, self._settings) if self._file is not None else None
        if key is None or self._file is None:
            return
        with self._lock:
            self._entries[key] = asdict(res)
            for old in list(self._entries)[: max(0, len(self._entries) - MAX_ENTRIES)]:
                del self._entries[old]
            tmp = self._file.with_name(f".{self._file.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            try:
                tmp.write_text(json.dumps(self._entries))
                os.replace(tmp, self._file)
            except OSError as exc:
                if not self._warned:
                    self._warned = True
                    log.warning("loadtest_cache_unwritable", path=str(self._file), error=str(exc),
                                next="verdicts are kept in memory only; a later `checkpoints` tests again")
