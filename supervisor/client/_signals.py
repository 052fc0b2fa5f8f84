"""``should_stop()`` / ``should_checkpoint()``: flags set by the supervisor's signals.

The handlers only record (as supervisord's do); the training loop decides at a step boundary::

    for step in ...:
        train_step()
        if client.should_checkpoint() or client.should_stop():
            save(...)
        if client.should_stop():
            break

Signals come from ``TSUP_STOP_SIGNAL`` (default SIGTERM) and ``TSUP_CHECKPOINT_SIGNAL`` (default
SIGUSR1). Handlers are installed by ``install()`` or on the first ``should_*()`` call, which must
happen in the main thread (Python only allows signal handlers there). Outside supervision
nothing is installed and both return False.
"""
from __future__ import annotations

import os
import signal
import sys
import threading

from ._env import ClientUsageError, supervised

_stop = threading.Event()
_checkpoint = threading.Event()
_installed = False


def _signum(var: str, default: signal.Signals) -> int:
    raw = os.environ.get(var, "").strip()
    if not raw:
        return int(default)
    if raw.isdigit():
        return int(raw)
    name = raw.upper() if raw.upper().startswith("SIG") else "SIG" + raw.upper()
    sig = getattr(signal.Signals, name, None)
    if sig is None:
        raise ClientUsageError(f"environment variable {var}={raw!r} is not a signal name (e.g. SIGTERM, SIGUSR1)")
    return int(sig)


def _on_stop(signum: int, frame: object) -> None:
    _stop.set()


def _on_checkpoint(signum: int, frame: object) -> None:
    _checkpoint.set()


def install() -> bool:
    """Install the stop / checkpoint signal handlers now; True when installed (supervised).

    Call it early in the main thread if a signal may arrive before the first ``should_*()`` call.
    Raises :class:`ClientUsageError` when called from another thread.
    """
    global _installed
    if _installed:
        return True
    if not supervised():
        return False
    stop_sig = _signum("TSUP_STOP_SIGNAL", signal.SIGTERM)
    ckpt_sig = _signum("TSUP_CHECKPOINT_SIGNAL", signal.SIGUSR1)
    if threading.current_thread() is not threading.main_thread():
        raise ClientUsageError(
            "supervisor.client.install() (or the first should_stop()/should_checkpoint()) must run in the "
            "main thread: Python installs signal handlers only there. Call install() at startup.")
    signal.signal(stop_sig, _on_stop)
    if ckpt_sig != stop_sig:
        signal.signal(ckpt_sig, _on_checkpoint)
    _installed = True
    return True


def should_stop() -> bool:
    """True once the supervisor asked the job to stop: save a checkpoint and exit cleanly.

    Stays True. False outside supervision.
    """
    if not _installed and not install():
        return False
    return _stop.is_set()


def should_checkpoint() -> bool:
    """True once per request for an emergency checkpoint (reading it clears it). False outside supervision."""
    if not _installed and not install():
        return False
    if _checkpoint.is_set():
        _checkpoint.clear()
        return True
    return False


def agree(device: object, *flags: bool) -> tuple[bool, ...]:
    """``flags`` OR-ed over the ranks of the default ``torch.distributed`` group (unchanged without one).

    The supervisor signals the whole process group, but the ranks see a signal at slightly
    different steps (nodes at different times): a rank that saves or stops alone deadlocks the
    others in their next collective. Every rank must call this at the same points (one small
    all-reduce on ``device``). Never imports torch: without ``torch.distributed`` loaded there is
    no group to agree with.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None or not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return flags
    import torch

    t = torch.tensor([int(f) for f in flags], dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return tuple(bool(x) for x in t.tolist())


def _reset_for_tests() -> None:
    global _installed
    _installed = False
    _stop.clear()
    _checkpoint.clear()
