"""``heartbeat(step)`` and ``checkpointing()``: one small file per rank in ``TSUP_HEARTBEAT_DIR``.

Cost: a call normally only compares ``time.monotonic_ns()`` with the next due time (well under a
microsecond); at most every ``TSUP_HEARTBEAT_INTERVAL_S`` (default 1 s) it rewrites a fixed-size
record in place with one ``pwrite`` (no rename, no directory churn). The record is JSON padded to
a fixed length, so a reader never sees a mix of a long old and a short new record::

    {"v": 1, "rank": 0, "world_size": 8, "pid": 123, "attempt": 0, "step": 100,
     "state": "running", "t": 1700000000.25, "seq": 42}

``state`` is ``"checkpointing"`` inside ``checkpointing()``, which gives the daemon's hang
detector its longer allowance while a slow save runs. Outside supervision everything is a no-op.
"""
from __future__ import annotations

import contextlib
import json
import operator
import os
import sys
import threading
import time
from typing import Iterator

from ._env import ClientUsageError, env_float, env_int, heartbeat_path, rank, supervised

RECORD_BYTES = 256
_NEVER = 1 << 62


class _State:
    def __init__(self) -> None:
        self.next_ns = 0  # 0: not initialised yet; _NEVER: disabled (not supervised / broken)
        self.interval_ns = 1_000_000_000
        self.fd = -1
        self.path = ""
        self.step: int | None = None
        self.seq = 0
        self.depth = 0  # nesting of checkpointing()
        self.rank = 0
        self.world_size = 1
        self.attempt = 0
        self.lock = threading.Lock()


_st = _State()


def _init() -> None:
    """Resolve the environment on first use (so scripts can set RANK before the first call)."""
    if not supervised() or not os.environ.get("TSUP_HEARTBEAT_DIR"):
        _st.next_ns = _NEVER
        return
    directory = os.environ["TSUP_HEARTBEAT_DIR"]
    _st.interval_ns = int(env_float("TSUP_HEARTBEAT_INTERVAL_S", 1.0) * 1e9)
    _st.rank = rank()
    _st.world_size = env_int("WORLD_SIZE", 1) or 1
    _st.attempt = env_int("TSUP_ATTEMPT", 0) or 0
    try:
        os.makedirs(directory, exist_ok=True)
        _st.path = str(heartbeat_path(directory, _st.rank))
        _st.fd = os.open(_st.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        # Never kill a training run over a heartbeat: say it once; the daemon sees no heartbeat.
        print(f"supervisor.client: cannot write heartbeats to {directory}: {exc}; "
              "heartbeats are off for this process (the supervisor may flag a hang)", file=sys.stderr)
        _st.next_ns = _NEVER
        return
    _st.next_ns = 1  # due now


def _write(state: str) -> None:
    _st.seq += 1
    rec = json.dumps({"v": 1, "rank": _st.rank, "world_size": _st.world_size, "pid": os.getpid(),
                      "attempt": _st.attempt, "step": _st.step, "state": state,
                      "t": round(time.time(), 4), "seq": _st.seq}, separators=(",", ":"))
    data = rec.encode().ljust(RECORD_BYTES - 1) + b"\n"
    try:
        if os.fstat(_st.fd).st_nlink == 0:
            _reopen()
        os.pwrite(_st.fd, data, 0)
    except OSError as exc:
        print(f"supervisor.client: heartbeat write failed: {exc}; heartbeats are off for this process",
              file=sys.stderr)
        _st.next_ns = _NEVER


def _reopen() -> None:
    """Our file was deleted (the supervisor's state dir removed and re-created under it): write a
    new one at the same path, or keep the old descriptor until the folder is back."""
    try:
        fd = os.open(_st.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:
        return  # the folder is not back yet: try again at the next beat
    os.close(_st.fd)
    _st.fd = fd


def check_step(step: object) -> int:
    if type(step) is int:
        return step
    if isinstance(step, bool):
        raise ClientUsageError(f"heartbeat(step={step!r}): step must be an integer step number, not a bool")
    try:
        return operator.index(step)  # type: ignore[arg-type]  # numpy / torch integer scalars
    except TypeError:
        raise ClientUsageError(
            f"heartbeat(step={step!r}): step must be an integer (the training step), got {type(step).__name__}"
        ) from None


def heartbeat(step: int | None = None) -> None:
    """Tell the supervisor this rank is alive (call once per training step; it is cheap).

    ``step`` is the current training step (an int), optional. No-op outside supervision.
    Raises :class:`ClientUsageError` when ``step`` is not an integer.
    """
    if step is not None:
        step = check_step(step)
        _st.step = step
    now = time.monotonic_ns()
    if now < _st.next_ns:
        return
    with _st.lock:
        if _st.next_ns == 0:
            _init()
            if _st.next_ns == _NEVER:
                return
        elif _st.next_ns == _NEVER:
            return
        _write("checkpointing" if _st.depth else "running")
        _st.next_ns = now + _st.interval_ns


@contextlib.contextmanager
def checkpointing() -> Iterator[None]:
    """Mark a checkpoint save: the supervisor allows ``[heartbeat] checkpoint_timeout_s`` meanwhile.

    ``with supervisor.client.checkpointing(): save(...)``. Nests; no-op outside supervision.
    """
    with _st.lock:
        if _st.next_ns == 0:
            _init()
        _st.depth += 1
        if _st.next_ns != _NEVER:
            _write("checkpointing")
    try:
        yield
    finally:
        with _st.lock:
            _st.depth -= 1
            if _st.next_ns != _NEVER:
                _write("checkpointing" if _st.depth else "running")
                _st.next_ns = time.monotonic_ns() + _st.interval_ns


def _reset_for_tests() -> None:
    """Forget the resolved environment (tests change ``TSUP_*`` between cases)."""
    global _st
    if _st.fd >= 0:
        os.close(_st.fd)
    _st = _State()
