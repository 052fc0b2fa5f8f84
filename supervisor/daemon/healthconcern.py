"""Health, as a port and a plug-in over one GPU backend: the pre-launch health gate
(:class:`LaunchGatePort`, the ``HealthGate`` port, on the launch-preparation thread) and the GPU and
host monitors of every attempt (:class:`HealthMonitors`, a plug-in). :class:`Backend` makes the
backend once, for whichever asks first (the plug-in, at the daemon's start)."""

from __future__ import annotations

import os
import threading
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from ..eventnames import EventName
from ..levels import Level
from ..events import Monitor
from .concerns import close_each
from .effects import Note
from .plugin import Closes, DaemonStarted, Effects, GivesMonitors, GivesStatus, OnStart, OnTicks, RunView, Tick
from .ports import GateVerdictLike

if TYPE_CHECKING:  # imported at start: the GPU backend's imports are not on the CLI's way
    from ..config.model import Config
    from ..health import GpuMonitor, HostMonitor, LaunchGate
    from ..health.gpu import GpuBackend


def job_env(cfg: Config) -> dict[str, str]:
    """The job's environment as launch.py builds it: its CUDA_VISIBLE_DEVICES names the job's GPUs."""
    return {**(dict(os.environ) if cfg.job.inherit_env else {}), **cfg.job.env}


class Backend:
    """The GPU backend of ``gpu.backend``, made once on first use; None (and ``error``) when it cannot be."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.error: Exception | None = None
        self._backend: GpuBackend | None = None
        self._made = False
        self._lock = threading.Lock()  # the loop (monitors) and the preparation thread (gate) ask

    def get(self) -> GpuBackend | None:
        with self._lock:
            if not self._made:
                self._made = True
                from ..health import make_backend

                try:
                    self._backend = make_backend(self.spec)
                except Exception as e:  # a broken GPU stack must not stop supervision: the plug-in says blind
                    self.error = e
            return self._backend


class LaunchGatePort:
    """The ``HealthGate`` port: the gate (may wait for GPU memory), built at its first check; its
    verdict is returned, and the runner books it (``health_gate``)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._gate: LaunchGate | None = None

    def check(self, cfg: Config, previous_pids: Sequence[int]) -> GateVerdictLike | None:
        if self._gate is None:
            if (backend := self.backend.get()) is None:
                return None  # no GPU backend: no gate (the plug-in said gpu_blind)
            from ..health import LaunchGate

            self._gate = LaunchGate(backend, cfg.gpu, checkpoint_dir=cfg.checkpoint_dir(),
                                    storage_probe=cfg.host.storage_probe, env=job_env(cfg))
        return self._gate.check(previous_pids)


class HealthMonitors(OnStart, OnTicks, GivesMonitors, GivesStatus, Closes):
    """The GPU and host monitors of every attempt; what the GPU monitor cannot see is said at the next tick."""

    name = "health"

    def __init__(self, backend: Backend, newest_checkpoint_bytes: Callable[[], int | None] = lambda: None) -> None:
        self.backend = backend
        self._newest_bytes = newest_checkpoint_bytes
        self.gpu_mon: GpuMonitor | None = None
        self.host_mon: HostMonitor | None = None
        self._blind: deque[str] = deque()  # from the GPU monitor's thread, said on the loop

    def started(self, n: DaemonStarted, run: RunView) -> Effects:
        from ..health import GpuMonitor, HostMonitor

        cfg = run.cfg
        backend = self.backend.get()
        if backend is None:
            return [Note(EventName.GPU_BLIND, Level.WARNING,
                         f"GPU backend unavailable ({self.backend.error}); GPU checks say 'unavailable'")]
        self.gpu_mon = GpuMonitor(backend, cfg.gpu, on_blind=self._blind.append, env=job_env(cfg))
        self.host_mon = HostMonitor(cfg.host, checkpoint_dir=cfg.checkpoint_dir(), state_dir=run.state_dir,
                                    last_checkpoint_bytes=self._newest_bytes)
        return ()

    def tick(self, n: Tick, run: RunView) -> Effects:
        out: list[Note] = []
        while self._blind:
            out.append(Note(EventName.GPU_BLIND, Level.WARNING, f"cannot see the GPUs: {self._blind.popleft()}; GPU "
                            "checks are unavailable (never 'healthy')", ledger_only=True))
        return out

    def monitors(self, run: RunView) -> Sequence[Monitor]:
        return [m for m in (self.gpu_mon, self.host_mon) if m is not None]

    def snapshot(self) -> Mapping[str, Any]:
        out: dict[str, Any] = {}
        for key, mon in (("gpu", self.gpu_mon), ("host", self.host_mon)):
            if mon is not None:
                try:
                    out[key] = mon.snapshot()
                except Exception as e:
                    out[key] = {"error": repr(e)}
        return out

    def status(self, run: RunView) -> Mapping[str, Any]:
        return {"gpus": self.gpu_mon.gpus()} if self.gpu_mon is not None else {}

    def close(self) -> None:
        close_each(self.gpu_mon)
