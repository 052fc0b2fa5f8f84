"""Fault injection for the trainer job scripts: the job hurts itself once, from the environment.

    FAULT=nan@N     fill the model's parameters with NaN at (the end of) step N
    FAULT=hang@N    block forever at step N, printing nothing
    FAULT=crash@N   raise at step N (a traceback and exit status 1)

One-shot: the first time a fault fires it creates the marker file (``FAULT_MARKER``, default
``<out_dir>/.fault_done``), and a later run (the relaunched attempt) that finds the marker
does not repeat it. Nothing here knows about any supervisor.
"""
from __future__ import annotations

import math
import os
import threading


class Fault:
    def __init__(self, out_dir: str) -> None:
        spec = os.environ.get("FAULT", "").strip()
        self.kind, self.step = "", -1
        if spec and spec != "none":
            kind, _, step = spec.partition("@")
            if kind not in ("nan", "hang", "crash") or not step.isdigit():
                raise SystemExit(f"FAULT={spec!r}: expected nan@N, hang@N or crash@N")
            self.kind, self.step = kind, int(step)
        self.marker = os.environ.get("FAULT_MARKER") or os.path.join(out_dir, ".fault_done")

    def due(self, step: int) -> str:
        """The fault to inject now ('' for none); marks it done so it fires only once."""
        if not self.kind or step != self.step or os.path.exists(self.marker):
            return ""
        os.makedirs(os.path.dirname(os.path.abspath(self.marker)), exist_ok=True)
        with open(self.marker, "w") as f:
            f.write(f"{self.kind}@{self.step} pid {os.getpid()}\n")
        return self.kind

    def inject(self, step: int, params=None) -> None:
        """Call once per step (after the optimizer step), with the model's parameters."""
        kind = self.due(step)
        if kind == "nan":
            import torch

            with torch.no_grad():
                for p in params or ():
                    p.fill_(math.nan)
        elif kind == "hang":
            threading.Event().wait()  # a deadlock: no output, no exit
        elif kind == "crash":
            raise RuntimeError(f"injected crash at step {step}")
