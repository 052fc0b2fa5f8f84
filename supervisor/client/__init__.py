"""``supervisor.client``: the small library a training script imports.

::

    from supervisor import client

    info = client.resume_info()            # path / step / skip_batches / attempt
    client.install()                       # stop / checkpoint signal handlers (main thread)
    for step in range(start, total):
        loss = train_step()
        client.heartbeat(step)             # cheap: call every step
        client.report(step, loss=loss)     # every logging step -> metrics-rank<R>.jsonl
        if client.should_checkpoint() or client.should_stop():
            with client.checkpointing():   # longer hang allowance while saving
                client.save_checkpoint(state, path, step=step)
        if client.should_stop():
            break

A checkpoint the script's trainer wrote itself gets the same manifest with
``client.record_checkpoint(path, step=step, metrics=...)``. Trainer users need none of this: one
callback does it all (``supervisor.client.hf.SupervisorCallback`` for the Hugging Face Trainer,
``supervisor.client.lightning.SupervisorCallback`` for Lightning; see docs/trainers.md).

Outside supervision (``TSUP_RUN_ID`` unset) every call is a silent no-op and the script runs as
usual. Misuse (a non-integer step, a non-numeric metric) raises :class:`ClientUsageError` at once.
Importing this package never imports torch; ``save_checkpoint`` and ``record_checkpoint`` (from
``._checkpoint``) are loaded on first access.
"""
from __future__ import annotations

import importlib
from typing import Any

from ._env import ClientUsageError, supervised
from ._heartbeat import checkpointing, heartbeat
from ._metrics import report
from ._resume import ResumeInfo, resume_info
from ._signals import install, should_checkpoint, should_stop

__all__ = [
    "ClientUsageError", "ResumeInfo", "checkpointing", "heartbeat", "install", "record_checkpoint", "report",
    "resume_info", "save_checkpoint", "should_checkpoint", "should_stop", "supervised",
]


def __getattr__(name: str) -> Any:
    # Lazy: the checkpoint module pulls in hashing/manifest code (and torch when saving); the
    # rest of the client must work without it.
    if name.startswith("_"):
        raise AttributeError(f"module 'supervisor.client' has no attribute {name!r}")
    _checkpoint = importlib.import_module("._checkpoint", __name__)

    try:
        return getattr(_checkpoint, name)
    except AttributeError:
        raise AttributeError(f"module 'supervisor.client' has no attribute {name!r}") from None
