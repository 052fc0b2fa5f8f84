"""``report(step=..., loss=..., ...)``: metric records as JSON lines the supervisor tails.

Written to ``TSUP_HEARTBEAT_DIR/metrics-rank<R>.jsonl`` (one file per rank, appended across
attempts), not to stdout: stdout belongs to the user's own logging, may be buffered or
interleaved across ranks, and a file needs no parsing guesswork. The daemon tails these files
(see ``supervisor.watch.heartbeat.HeartbeatMonitor``) and feeds them to the same detectors as the
log lines. Non-finite values are written as ``NaN`` / ``Infinity`` so the NaN detector sees them.
A report also counts as a heartbeat.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import IO

from .. import strictjson
from ._env import ClientUsageError, env_int, metrics_path, rank, supervised
from ._heartbeat import check_step, heartbeat

_lock = threading.Lock()
_file: IO[str] | None = None
_disabled = False
_looked_at = 0.0  # monotonic: when the file was last checked for having been deleted
LOOK_EVERY_S = 1.0


def _number(name: str, value: object) -> float:
    if isinstance(value, (bool, str, bytes)) or value is None:
        raise ClientUsageError(f"report({name}={value!r}): {name} must be a number, got {type(value).__name__}")
    try:
        return float(value)  # type: ignore[arg-type]  # ints, floats, numpy / 1-element torch values
    except (TypeError, ValueError):
        raise ClientUsageError(
            f"report({name}={value!r}): {name} must be a number, got {type(value).__name__}") from None


def as_number(value: object) -> float | None:
    """A value a trainer logged as a float, or None when it is not a number: ints, floats,
    numpy / 1-element torch values, formatted strings (``'2.31'``; ``'nan'``)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, RuntimeError):
        return None


def _open() -> IO[str] | None:
    global _file, _disabled
    if _file is not None or _disabled:
        return _file
    directory = os.environ.get("TSUP_HEARTBEAT_DIR")
    if not supervised() or not directory:
        _disabled = True
        return None
    try:
        os.makedirs(directory, exist_ok=True)
        _file = open(metrics_path(directory, rank()), "a", buffering=1, encoding="utf-8")
    except OSError as exc:
        print(f"supervisor.client: cannot write metrics to {directory}: {exc}; metric reports are off",
              file=sys.stderr)
        _disabled = True
    return _file


def _follow_deletion(f: IO[str]) -> IO[str]:
    """Our file deleted (the supervisor's state dir removed, then re-created by the daemon): a new
    file at the same path once its folder is back; until then the old file takes the records. At
    most once a second (one fstat); the folder is never created here (it is the daemon's, 0700)."""
    global _file, _looked_at
    now = time.monotonic()
    if now - _looked_at < LOOK_EVERY_S:
        return f
    _looked_at = now
    try:
        if os.fstat(f.fileno()).st_nlink > 0:
            return f
        new = open(f.name, "a", buffering=1, encoding="utf-8")
    except (OSError, ValueError):
        return f  # the folder is not back yet
    f.close()
    _file = new
    return new


def report(step: int | None = None, *, loss: float | None = None, grad_norm: float | None = None,
           lr: float | None = None, tokens_per_sec: float | None = None, val_loss: float | None = None,
           **extra: float) -> None:
    """Report training metrics for ``step`` (call every logging step; a few microseconds).

    Known names: ``loss``, ``grad_norm``, ``lr``, ``tokens_per_sec``, ``val_loss``; any other
    keyword must be a number and is kept as an extra metric. No-op outside supervision; raises
    :class:`ClientUsageError` on a non-integer step or a non-numeric value.
    """
    rec: dict[str, object] = {}
    if step is not None:
        rec["step"] = check_step(step)
    for name, value in (("loss", loss), ("grad_norm", grad_norm), ("lr", lr),
                        ("tokens_per_sec", tokens_per_sec), ("val_loss", val_loss)):
        if value is not None:
            rec[name] = _number(name, value)
    for name, value in extra.items():
        rec[name] = _number(name, value)
    if len(rec) <= ("step" in rec):
        raise ClientUsageError("report() needs at least one metric, e.g. report(step=10, loss=2.3)")
    if _disabled:
        return
    heartbeat(rec.get("step"))  # type: ignore[arg-type]
    with _lock:
        f = _open()
        if f is None:
            return
        f = _follow_deletion(f)
        rec["rank"] = rank()
        rec["attempt"] = env_int("TSUP_ATTEMPT", 0) or 0
        rec["t"] = round(time.time(), 4)
        try:
            # strict JSON (a NaN loss as "NaN"): the watch and the report read the string as the number
            f.write(strictjson.dumps(rec, separators=(",", ":")) + "\n")
        except (OSError, ValueError) as exc:
            print(f"supervisor.client: metric report failed: {exc}", file=sys.stderr)


def _reset_for_tests() -> None:
    global _file, _disabled, _looked_at
    if _file is not None:
        _file.close()
    _file = None
    _disabled = False
    _looked_at = 0.0


__all__ = ["report"]
