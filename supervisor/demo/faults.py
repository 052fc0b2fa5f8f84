"""The demo job's injectable faults (they live here and nowhere in the supervisor; what each does
is ``supervisor.demo.FAULT_HELP``): where each fires by default, and the book of those already
fired, kept beside the checkpoints so that each fires once per run."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import torch

from . import DEFAULT_FAULTS, FAULT_HELP

# Where each fault fires by default, as a fraction of --steps: spread over the run, each after a
# checkpoint so that a rollback has somewhere to go, and (for the default 600 steps, checkpoint
# every 50) 10-20 steps past one, so that little work is redone: 120, 210, 312, 414, 480->500.
DEFAULT_FAULT_FRACTIONS: Mapping[str, float] = {
    "nan": 0.20,
    "hang": 0.35,
    "crash": 0.52,
    "oom": 0.69,
    "corrupt_ckpt": 0.80,
    "spike": 0.30,
    "bad_resume": 0.0,
}
SPIKE_STEPS = 30
SPIKE_LR_FACTOR = 50.0
BAD_RESUME_LR_FACTOR = 100.0


@dataclass(frozen=True)
class Fault:
    name: str
    step: int


def parse_faults(spec: str | None, steps: int) -> tuple[Fault, ...]:
    """``"nan,crash@120"`` -> faults; ``None`` -> the default set; ``""``/``"none"`` -> none."""
    names = DEFAULT_FAULTS if spec is None else tuple(
        s.strip() for s in spec.split(",") if s.strip() and s.strip().lower() != "none"
    )
    faults: list[Fault] = []
    for item in names:
        name, _, at = item.partition("@")
        if name not in FAULT_HELP:
            raise SystemExit(f"unknown demo fault {name!r}; known: {', '.join(FAULT_HELP)}")
        step = int(at) if at else max(1, int(round(DEFAULT_FAULT_FRACTIONS[name] * steps)))
        faults.append(Fault(name, step))
    return tuple(faults)


class FaultBook:
    """Which faults have fired in this run, persisted beside the checkpoints."""

    def __init__(self, path: Path, run_id: str, fresh: bool) -> None:
        self.path = path
        self.run_id = run_id
        self.fired: set[str] = set()
        if path.exists() and not fresh:
            try:
                data = json.loads(path.read_text())
                if data.get("run_id") == run_id:
                    self.fired = set(data.get("fired", []))
            except (OSError, ValueError):
                pass  # an unreadable book only means a fault may fire again; not fatal
        self._write()

    def fire(self, name: str, step: int) -> None:
        # Recorded before the fault takes effect: a crash or kill must not make it fire again.
        self.fired.add(name)
        self._write()
        # Announced in words the detectors do not react to: the evidence must be the fault itself.
        print(f"demo: injecting the {name!r} fault at step {step}: {FAULT_HELP[name].replace('OutOfMemoryError', 'out-of-memory error')}",
              file=sys.stderr, flush=True)

    def _write(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as f:
            json.dump({"run_id": self.run_id, "fired": sorted(self.fired)}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


def raise_fake_oom() -> None:
    raise torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity; "
        "76.20 GiB already allocated; 1.05 GiB free; 77.48 GiB reserved in total by PyTorch) "
        "If reserved memory is >> allocated memory try setting max_split_size_mb to avoid "
        "fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF"
    )
