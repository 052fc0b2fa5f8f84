"""The calls the demo job makes to ``supervisor.client``, with a local fallback for any piece
that is missing, so the job runs even where ``supervisor.client`` is absent or older than it (it
then says so on stderr)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple

import torch


class ResumeInfo(NamedTuple):
    path: str | None
    step: int | None
    skip_batches: int
    attempt: int


class _FallbackClient:
    """Enough of ``supervisor.client`` for the demo: env-driven, no-op outside supervision."""

    def __init__(self) -> None:
        self._stop = False
        self._ckpt = False
        self._hb_path: Path | None = None
        hb_dir = os.environ.get("TSUP_HEARTBEAT_DIR")
        if hb_dir:
            rank = os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0"))
            self._hb_path = Path(hb_dir) / f"rank{rank}.json"
            self._hb_path.parent.mkdir(parents=True, exist_ok=True)

    def install_signals(self) -> None:
        # Handlers only record; the loop acts at a step boundary.
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "_stop", True))
        signal.signal(signal.SIGUSR1, lambda *_: setattr(self, "_ckpt", True))

    def heartbeat(self, step: int | None = None) -> None:
        if self._hb_path is None:
            return
        tmp = self._hb_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"time": time.time(), "step": step, "pid": os.getpid()}))
        os.replace(tmp, self._hb_path)

    def report(self, step: int | None = None, **metrics: float) -> None:
        return None

    def should_stop(self) -> bool:
        return self._stop

    def should_checkpoint(self) -> bool:
        flag, self._ckpt = self._ckpt, False
        return flag

    def checkpointing(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def resume_info(self) -> ResumeInfo:
        path = os.environ.get("TSUP_RESUME_FROM") or None
        return ResumeInfo(
            path=path,
            step=None,
            skip_batches=int(os.environ.get("TSUP_SKIP_BATCHES", "0") or 0),
            attempt=int(os.environ.get("TSUP_ATTEMPT", "0") or 0),
        )

    def save_checkpoint(
        self,
        obj: Any,
        path: str | os.PathLike[str],
        *,
        step: int,
        config: Mapping[str, Any] | None = None,
        metrics: Mapping[str, Any] | None = None,
    ) -> Path:
        # Atomic: temp file, fsync, rename, fsync the directory.
        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        return path


class Client:
    """The calls the demo makes, bound to ``supervisor.client`` where it has them."""

    def __init__(self) -> None:
        self.fallback = _FallbackClient()
        self.missing: list[str] = []
        try:
            from supervisor import client as real  # optional at run time
        except Exception:  # any import failure means: use the fallback
            real = None  # type: ignore[assignment]
        names = ("heartbeat", "report", "should_stop", "should_checkpoint", "checkpointing",
                 "resume_info", "save_checkpoint")
        for name in names:
            fn = getattr(real, name, None) if real is not None else None
            if fn is None:
                self.missing.append(name)
                fn = getattr(self.fallback, name)
            setattr(self, name, fn)
        # The fallback flags need their own signal handlers; the real client installs its own,
        # early, so a stop request that arrives before the first should_stop() is not lost.
        if "should_stop" in self.missing or "should_checkpoint" in self.missing:
            self.fallback.install_signals()
        elif callable(getattr(real, "install", None)):
            real.install()

    heartbeat: Callable[..., None]
    report: Callable[..., None]
    should_stop: Callable[[], bool]
    should_checkpoint: Callable[[], bool]
    checkpointing: Callable[[], contextlib.AbstractContextManager[Any]]
    resume_info: Callable[[], Any]
    save_checkpoint: Callable[..., Any]


def resume_fields(info: Any) -> ResumeInfo:
    """Accept a tuple, a NamedTuple or a dataclass from the client's ``resume_info()``."""
    if isinstance(info, tuple) and not hasattr(info, "_fields"):
        path, step, skip, attempt = (list(info) + [None, None, 0, 0])[:4]
    else:
        path = getattr(info, "path", None)
        step = getattr(info, "step", None)
        skip = getattr(info, "skip_batches", 0)
        attempt = getattr(info, "attempt", 0)
    return ResumeInfo(
        path=str(path) if path else None,
        step=int(step) if step is not None else None,
        skip_batches=int(skip or 0),
        attempt=int(attempt or 0),
    )
