"""The health port and its concern: the GPU and host monitors of every attempt, and the
pre-launch health gate."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Sequence

from .concerns import close_each
from ..events import Monitor
from .ports import Concern, DaemonView, GateVerdictLike

if TYPE_CHECKING:  # imported at start: the GPU backend's imports are not on the CLI's way
    from ..health import GpuMonitor, HostMonitor, LaunchGate


class HealthConcern(Concern):
    """The GPU and host monitors of every attempt, and the pre-launch health gate."""

    name = "health"

    def __init__(self, newest_checkpoint_bytes: Callable[[], int | None] = lambda: None) -> None:
        self._newest_bytes = newest_checkpoint_bytes
        self.gpu_mon: GpuMonitor | None = None
        self.host_mon: HostMonitor | None = None
        self.launch_gate: LaunchGate | None = None
        self.daemon: DaemonView | None = None

    def start(self, daemon: DaemonView) -> None:
        from ..health import GpuMonitor, HostMonitor, LaunchGate, make_backend

        self.daemon = daemon
        cfg = daemon.cfg
        ckdir = cfg.checkpoint_dir()
        try:
            backend = make_backend(cfg.gpu.backend)
        except Exception as e:  # a broken GPU stack must not stop supervision: say we are blind
            daemon.event("gpu_blind", "warning", f"GPU backend unavailable ({e}); GPU checks say 'unavailable'")
            return
        # The job's environment as launch.py builds it: its CUDA_VISIBLE_DEVICES names the job's GPUs
        base = dict(os.environ) if cfg.job.inherit_env else {}
        job_env = {**base, **cfg.job.env}
        self.gpu_mon = GpuMonitor(backend, cfg.gpu, on_blind=lambda reason: daemon.event(
            "gpu_blind", "warning", f"cannot see the GPUs: {reason}; GPU checks are unavailable (never 'healthy')",
            ledger_only=True), env=job_env)
        self.host_mon = HostMonitor(cfg.host, checkpoint_dir=ckdir, state_dir=daemon.state_dir,
                                    last_checkpoint_bytes=self._newest_bytes)
        self.launch_gate = LaunchGate(backend, cfg.gpu, checkpoint_dir=ckdir, storage_probe=cfg.host.storage_probe,
                                      env=job_env)

    def check(self, previous_pids: Sequence[int]) -> GateVerdictLike | None:
        if self.launch_gate is None:
            return None
        verdict = self.launch_gate.check(previous_pids)
        assert self.daemon is not None
        self.daemon.event("health_gate", "info" if verdict.passed else "error",
                          f"pre-launch health gate: {verdict.summary()}", ledger_only=True,
                          passed=verdict.passed, waited_s=verdict.waited_s)
        return verdict

    def monitors(self) -> list[Monitor]:
        return [m for m in (self.gpu_mon, self.host_mon) if m is not None]

    def snapshot(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, mon in (("gpu", self.gpu_mon), ("host", self.host_mon)):
            if mon is not None:
                try:
                    out[key] = mon.snapshot()
                except Exception as e:
                    out[key] = {"error": repr(e)}
        return out

    def status(self) -> dict[str, Any]:
        return {"gpus": self.gpu_mon.gpus()} if self.gpu_mon is not None else {}

    def close(self) -> None:
        close_each(self.gpu_mon)
