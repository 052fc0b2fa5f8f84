"""torchrun's root cause: which rank failed first, with what exception, where.

Each attempt gets ``TORCHELASTIC_ERROR_FILE=STATE/torchelastic/attempt-N/error.json`` (unless the
job's environment names one). How torch fills it (torch/distributed/elastic/multiprocessing):

- torchrun's agent gives every worker a file of its own,
  ``<log dir>/<run id>_*/attempt_<k>/<local rank>/error.json`` (``--log-dir``, else a
  ``torchelastic_*`` folder in the temp dir); a worker whose entry point is decorated with
  ``@record`` writes ``{"message": {"message": "ValueError: boom", "extraInfo": {"py_callstack":
  <traceback>, "timestamp": "<s>"}}}`` there when it raises.
- When a worker fails, the agent (its own ``main`` is ``@record``) copies the first failure's file
  to *its* ``TORCHELASTIC_ERROR_FILE``, ours, adding ``errorCode``: the rank is not in it. It is
  the directory name of the per-rank file with the same content, which we look for.
- A plain ``python train.py`` whose main is ``@record`` writes our file itself.

Plain JSON only: the daemon never imports torch. Reading never raises (a half-written or foreign
file gives None); it runs once, after a failed attempt, on the daemon's loop, so the search of the
per-rank files is bounded.
"""
from __future__ import annotations

import glob
import json
import os
import re
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..redact import MAX_VALUE_CHARS, redact_line

ENV = "TORCHELASTIC_ERROR_FILE"
#: at most this many per-rank files are opened when looking for the failing rank
MAX_RANK_FILES = 256
FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')


def error_file(state_dir: Path, attempt: int) -> Path:
    """The error file given to ``attempt`` (its folder is made at launch)."""
    return state_dir / "torchelastic" / f"attempt-{attempt}" / "error.json"


@dataclass(frozen=True)
class RootCause:
    """The first failure torchrun saw (or the ``@record`` process's own exception)."""

    exc_type: str  # "ValueError"
    message: str  # "boom at step 3"
    last_frame: str | None  # "train.py:12 in main": where it was raised
    rank: int | None  # the failing worker's rank (error file: local, global on a single node; output: global)
    error_code: int | None  # the worker's exit code as the agent saw it (negative: the signal that killed it)
    file: str  # the error file read (the job log for "output")
    # "error_file" (the file above, @record) or "output" (torchrun's summary and the rank's traceback
    # in the job's output, job/torchrunlog.py: a script without @record)
    source: str = "error_file"

    def line(self) -> str:
        """One line for people: ``rank 1 raised ValueError: boom at step 3 (at train.py:12 in main)``
        (its exit code is ``error_code``); ``rank 1 was killed by SIGKILL (no Python traceback of it
        in the output)``."""
        who = f"rank {self.rank}" if self.rank is not None else "a worker"
        code = self.error_code
        if not self.exc_type and not self.message:
            how = "ended" if code is None else (f"was killed by {_signal_name(-code)}" if code < 0
                                                 else f"exited with code {code}")
            return f"{who} {how} (no Python traceback of it in the output)"
        where = f" (at {self.last_frame})" if self.last_frame else ""
        return f"{who if self.rank is not None else ''} raised {self.exc_type}: {self.message}{where}".lstrip()

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "exception": self.exc_type, "message": self.message,
                "last_frame": self.last_frame, "error_code": self.error_code, "file": self.file,
                "source": self.source, "line": self.line()}


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _load(path: str | Path) -> Any:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return json.loads(f.read(1 << 20))
    except (OSError, ValueError):
        return None


def _parts(data: Any) -> tuple[str, str, str, int | None] | None:
    """(text "Type: message", traceback, timestamp, error code) of an error file's content."""
    if not isinstance(data, Mapping):
        return None
    msg = data.get("message")
    if isinstance(msg, str):  # torch's "new message format": the text alone
        return msg, "", "", None
    if not isinstance(msg, Mapping) or not isinstance(msg.get("message"), str):
        return None
    extra = msg.get("extraInfo") if isinstance(msg.get("extraInfo"), Mapping) else {}
    code = msg.get("errorCode")
    return (msg["message"], str(extra.get("py_callstack") or ""), str(extra.get("timestamp") or ""),  # type: ignore[union-attr]
            code if isinstance(code, int) and not isinstance(code, bool) else None)


def last_frame(traceback_text: str) -> str | None:
    """``file:line in func`` of a traceback's last frame (where the exception was raised)."""
    frames = [m for m in (FRAME.match(line) for line in traceback_text.splitlines()) if m]
    if not frames:
        return None
    m = frames[-1]
    return f"{m['file']}:{m['line']} in {m['func']}"


def rank_dirs(argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """Where torchrun puts its per-rank error files: ``--log-dir`` (``--log_dir``) of the
    command, else a ``torchelastic_*`` folder in the job's temp dir."""
    roots: list[str] = []
    for i, a in enumerate(argv):
        for flag in ("--log-dir", "--log_dir"):
            if a == flag and i + 1 < len(argv):
                roots.append(argv[i + 1])
            elif a.startswith(flag + "="):
                roots.append(a.split("=", 1)[1])
    tmp = env.get("TMPDIR") or tempfile.gettempdir()
    roots.append(os.path.join(tmp, "torchelastic_*"))
    return roots


def _failing_rank(text: str, stamp: str, roots: Sequence[str], since: float) -> int | None:
    """The local rank whose own error file holds the same failure (newest first)."""
    found: list[tuple[float, str]] = []
    for root in roots:
        for p in glob.glob(os.path.join(root, "*", "attempt_*", "*", "error.json")):
            try:
                mtime = os.stat(p).st_mtime
            except OSError:
                continue
            if mtime >= since - 1.0:  # an older run's files are not this attempt's
                found.append((mtime, p))
    for _, p in sorted(found, reverse=True)[:MAX_RANK_FILES]:
        parts = _parts(_load(p))
        if parts and parts[0] == text and parts[2] == stamp:
            name = os.path.basename(os.path.dirname(p))
            if name.isdigit():
                return int(name)
    return None


def read_root_cause(path: Path, *, argv: Sequence[str] = (), env: Mapping[str, str] | None = None,
                    since: float = 0.0) -> RootCause | None:
    """The root cause written to ``path`` during an attempt that started at ``since`` (wall
    time), with the failing rank when torchrun's per-rank file is found; None when there is none."""
    try:
        if os.stat(path).st_mtime < since - 1.0:
            return None  # left by an earlier run with the same attempt number
    except OSError:
        return None
    parts = _parts(_load(path))
    if parts is None:
        return None
    text, tb, stamp, code = parts
    exc_type, _, message = text.partition(": ")
    if not message and " " in exc_type:  # not "Type: message": keep the text whole
        exc_type, message = "", text
    rank = _failing_rank(text, stamp, rank_dirs(argv, env or {}), since) if stamp else None
    # The job's own text goes to the log, the ledger and history: masked and bounded there.
    return RootCause(redact_line(exc_type or "error", limit=200), redact_line(message, limit=MAX_VALUE_CHARS),
                     last_frame(tb), rank, code, str(path))
