"""scripts/gpu_check's issue 39 checks (supervisor/health/gpuchecks.py) on a simulated node: the real
NVML backend over the real pynvml with its C calls simulated, and the CUDA children replaced by
stand-ins that do to the node what the real ones do on a GPU (hold memory under their pid, raise an
application Xid). The real run needs a GPU (none here); this keeps its logic from wasting one."""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from supervisor.health import gpuchecks
from supervisor.health.nvml import NvmlBackend
from tests.helpers.nvml_clib import SimGpu, SimNode, simulated_pynvml


def test_every_item_passes_on_a_node_that_behaves(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    node = SimNode([SimGpu("GPU-aaaa", used=0), SimGpu("GPU-bbbb", used=0)])
    pids = itertools.count(4_000_000)

    class StandIn:
        def __init__(self, python: str, uuid: str, frac: float, fault: bool, work: Path) -> None:
            self.gpu = next(i for i, g in enumerate(node.gpus) if g.uuid == uuid)
            self.pid, self.fault, self.ready, self.first_line = next(pids), fault, True, "ready"
            self.held = int(node.gpus[self.gpu].total * frac)
            node.gpus[self.gpu].procs[self.pid] = self.held
            node.gpus[self.gpu].used += self.held

        def go(self, timeout: float = 60) -> str:
            if self.fault:
                node.send(self.gpu, 31)  # the MMU fault of an illegal address
            del node.gpus[self.gpu].procs[self.pid]
            node.gpus[self.gpu].used -= self.held
            return "an illegal memory access was encountered" if self.fault else ""

    real_init = NvmlBackend.__init__

    def simulated_init(self: Any, nvml: Any = None) -> None:
        real_init(self, simulated_pynvml(node))

    monkeypatch.setattr(gpuchecks, "Child", StandIn)
    monkeypatch.setattr(NvmlBackend, "__init__", simulated_init)
    monkeypatch.setattr(gpuchecks.tempfile, "mkdtemp", lambda prefix="": str(tmp_path))
    # the stand-ins act at once: the script's pauses for a real driver are cut short
    rows = {r["check"]: r for r in gpuchecks.event_checks("python", settle_s=0.0, quiet_s=0.5, release_s=0.3)}
    failed = {k: r for k, r in rows.items() if r["ok"] is False}
    assert not failed, failed
    assert rows["Xid attributed to the child"]["value"] == [31]
    assert rows["MIG"]["ok"] is None and rows["gate, foreign holder on another GPU"]["ok"] is True
    assert node.gpus[0].used == 0 and not node.gpus[0].procs  # every stand-in released what it held
