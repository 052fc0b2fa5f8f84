"""Test-only: the real daemon (``python -m supervisor ARGS...``) with a scripted GPU node.

    python tests/helpers/fake_gpu_daemon.py TIMELINE.json ARGS...

Production has no way to swap a node's GPU health for a fake (no environment variable, no config
value): ``gpu.backend`` is ``nvml`` or ``none``. The end-to-end tests inject the fake here, in a
process of their own, by replacing the backend factory the daemon calls
(``supervisor.health.make_backend``) before the CLI starts. Two kinds of node:

* a timeline (``supervisor/health/gpufake.py``, :meth:`FakeBackend.from_file`): the scripted
  backend, behind the same interface as the real one;
* ``{"simulated": {"gpus": [...], "events": [[t, gpu, code, gi, ci], ...]}}``: the real backend
  (``NvmlBackend``) over NVIDIA's real ``pynvml`` with only its C calls simulated
  (``tests/helpers/nvml_clib.py``). Each GPU is a ``SimGpu``'s fields (error codes by name:
  ``"no_permission"``, ``"unknown"``, ``"gpu_is_lost"``, ``"not_supported"``), ``migs`` a list of
  ``SimMig`` fields; each event is sent ``t`` seconds after the daemon registered for events
  (``gi``/``ci`` null: the whole GPU's); one sent before that would be drained as stale.
  ``"xid_file": PATH`` (with ``"xid_gpu": N``): when a test writes an Xid code into PATH, the node
  raises it on GPU N (an event at the moment the test chooses).
"""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from supervisor import health
from supervisor.health.gpufake import FakeBackend

ERRORS = {"no_permission": 4, "not_supported": 3, "gpu_is_lost": 15, "unknown": 999}


def simulated(spec: dict[str, Any]) -> Any:
    from supervisor.health.nvml import NvmlBackend
    from tests.helpers.nvml_clib import SimGpu, SimMig, SimNode, simulated_pynvml

    def gpu(d: dict[str, Any]) -> SimGpu:
        kw: dict[str, Any] = {k: (ERRORS[v] if k.endswith("_error") and isinstance(v, str) else v)
                              for k, v in d.items()}
        kw["migs"] = [SimMig(**m) for m in d.get("migs", [])]
        kw["procs"] = {int(p): int(b) for p, b in d.get("procs", {}).items()}
        return SimGpu(**kw)

    node = SimNode([gpu(g) for g in spec["gpus"]])
    events = sorted(spec.get("events", []))

    def send() -> None:
        node.listening.wait(120)
        t0 = time.monotonic()
        for t, index, code, gi, ci in events:
            time.sleep(max(0.0, t0 + t - time.monotonic()))  # the node's own clock: not a test's wait
            node.send(index, code, gi=0xFFFFFFFF if gi is None else gi, ci=0xFFFFFFFF if ci is None else ci)

    def on_file(path: Path, gpu: int) -> None:
        while not path.exists():  # the node's side: it raises the Xid when the test asks for it
            time.sleep(0.05)
        node.send(gpu, int(path.read_text().strip() or "0"))

    threading.Thread(target=send, name="sim-gpu-events", daemon=True).start()
    if spec.get("xid_file"):
        threading.Thread(target=on_file, args=(Path(spec["xid_file"]), int(spec.get("xid_gpu", 0))),
                         name="sim-gpu-xid-file", daemon=True).start()
    return NvmlBackend(simulated_pynvml(node))


def main() -> int:
    timeline = sys.argv[1]
    data = json.loads(Path(timeline).read_text())
    if "simulated" in data:
        backend = simulated(data["simulated"])
        health.make_backend = lambda _spec, **_kw: backend
    else:
        health.make_backend = lambda _spec, **_kw: FakeBackend.from_file(timeline)
    from supervisor.cli.main import main as cli_main

    return cli_main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
