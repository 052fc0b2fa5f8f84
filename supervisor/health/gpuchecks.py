"""``scripts/gpu_check``, the checks of issue 39 item 7: what only a real node can answer, one
pass/fail row each (``python -m supervisor.health.gpucheck`` prints them after the NVML and OOM rows).

1. **events registered**: the backend registers each GPU's supported event types and says which.
2. **MIG**: each GPU's MIG devices and, on a MIG parent, memory read through them (skipped when
   no GPU is in MIG mode).
3. **job pids seen**: a child holding CUDA memory is in NVML's process list of its GPU (fails inside a
   container without the host's pid namespace: the job's share then reads 0, Xids are not attributed).
4. **Xid attributed to the child**: a child makes an illegal address access (an application Xid,
   harmless to the GPU); the monitor, watching that child as the job, sees it on the child's GPU
   and acts on it (not noted as foreign).
5. **stale Xid not delivered**: the same fault raised while no attempt runs; the next attempt's
   monitor drains it (``gpu_events_stale``) and detects nothing.
6. **gate with a foreign holder**: a child holds 10 % of GPU 0 (not a previous attempt's pid); the
   gate for a job on another GPU passes at once; on GPU 0 itself it waits (that GPU is busy).

Each child runs the Python given (a CUDA torch), on one GPU through ``CUDA_VISIBLE_DEVICES=<UUID>``.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any, Callable

# A child on one GPU: holds FRAC of its memory, prints "ready", waits for GO to appear; then, with
# FAULT=1, reads through a pointer 1 TiB past its tensor (an MMU fault: Xid 31/13/43, the GPU
# unharmed) and exits; else exits at once.
CHILD = textwrap.dedent("""\
    import os, sys, time, torch
    frac, go, fault = float(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
    free, total = torch.cuda.mem_get_info()
    held = torch.empty(max(1, int(total * frac)), dtype=torch.uint8, device="cuda")
    print("ready", os.getpid(), flush=True)
    while not os.path.exists(go):
        time.sleep(0.05)
    if fault:
        base = held.data_ptr() + (1 << 40)
        class Bad:
            __cuda_array_interface__ = {"shape": (1 << 20,), "typestr": "<f4", "data": (base, False), "version": 3}
        t = torch.as_tensor(Bad(), device="cuda")
        print(float(t.sum()), flush=True)
    """)


def _row(name: str, value: object, ok: bool | None, note: str = "") -> dict[str, Any]:
    return {"check": name, "value": value, "ok": ok, "note": note}


class Child:
    """One child on GPU ``uuid``; ``go()`` releases it (to fault or to exit)."""

    def __init__(self, python: str, uuid: str, frac: float, fault: bool, work: Path) -> None:
        self.go_file = work / f"go-{time.monotonic_ns()}"
        script = work / "child.py"
        script.write_text(CHILD)
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": uuid}
        self.proc = subprocess.Popen([python, str(script), str(frac), str(self.go_file), "1" if fault else "0"],
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""  # blocks until ready (or its death)
        self.ready = line.startswith("ready")
        self.pid = self.proc.pid
        self.first_line = line.strip()

    def go(self, timeout: float = 60) -> str:
        self.go_file.touch()
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        return (self.first_line + "\n" + (out or "")).strip()[-300:]


def _wait(cond: Callable[[], bool], seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def _ctx(pid: int, work: Path) -> Any:
    from ..events import AttemptContext

    return AttemptContext(run_id="gpu-check", attempt=0, pgid=pid, pid=pid, started_monotonic=time.monotonic(),
                          state_dir=work, heartbeat_dir=work, checkpoint_dir=None, resume_from=None,
                          resume_step=None)


def event_checks(python: str, *, settle_s: float = 2.0, quiet_s: float = 5.0,
                 release_s: float = 3.0) -> list[dict[str, Any]]:
    """Items 1-6 above; every failure is a row, never an exception. ``settle_s``: how long a fault
    raised between attempts is given to reach the event set; ``quiet_s``: how long the next attempt
    must see nothing; ``release_s``: the gate's wait for a busy GPU."""
    from .config import GpuConfig
    from .gate import run_gate
    from .gpu import GpuBlindError
    from .gpumonitor import GpuMonitor
    from .nvml import NvmlBackend

    rows: list[dict[str, Any]] = []
    backend = NvmlBackend()
    try:
        backend.init()
        count = backend.device_count()
    except GpuBlindError as exc:
        return [_row("issue 39 checks", "NVML unavailable", False, str(exc))]
    uuids = [backend.device_info(i).uuid for i in range(count)]
    backend.wait_events(0.0)  # registers
    reg = {i: m for i, m in backend.registered.items()}
    xid_bit = 0x8
    rows.append(_row("events registered", {i: hex(m) for i, m in reg.items()},
                     bool(reg) and all(m & xid_bit for m in reg.values()),
                     "Xid on every GPU (ECC where supported)"))
    migs = {i: backend.mig_devices(i) for i in range(count)}
    if any(migs.values()):
        mem_ok = all(backend.memory(i).total > 0 for i, m in migs.items() if m)
        rows.append(_row("MIG memory through MIG devices", {i: len(m) for i, m in migs.items()}, mem_ok))
    else:
        rows.append(_row("MIG", "no GPU in MIG mode", None, "skipped"))
    work = Path(tempfile.mkdtemp(prefix="tsup-gpucheck39-"))
    cfg = GpuConfig(poll_s=0.2, release_timeout_s=release_s)
    env0 = {"CUDA_VISIBLE_DEVICES": uuids[0]}

    # 3 + 4: the child's pid in NVML's list, its fault attributed to it
    child = Child(python, uuids[0], 0.02, True, work)
    if not child.ready:
        return rows + [_row("CUDA child", "did not start", False, child.go(10))]
    rows.append(_row("job pids seen", child.pid, _wait(lambda: child.pid in backend.processes(0), 5),
                     "NVML's process list of the child's GPU"))
    got: list[Any] = []
    mon = GpuMonitor(backend, cfg, env=env0)
    mon.start(_ctx(child.pid, work), got.append)
    _wait(lambda: mon.polls >= 2, 5)
    out = child.go()
    seen = _wait(lambda: any(d.details.get("kind") == "xid" for d in got), 30)
    mon.stop()
    codes = [d.details.get("code") for d in got if d.details.get("kind") == "xid"]
    rows.append(_row("Xid attributed to the child", codes, seen and all(c in (13, 31, 43) for c in codes),
                     "illegal address in the child; " + out.splitlines()[-1][:120] if out else ""))

    # 5: the same fault while no attempt runs: the next attempt's monitor must not see it
    child = Child(python, uuids[0], 0.02, True, work)
    child.go()
    time.sleep(settle_s)  # the driver's event reaches the event set (nobody waits on it now)
    got = []
    mon.start(_ctx(os.getpid(), work), got.append)
    quiet = not _wait(lambda: bool(got), quiet_s)
    mon.stop()
    rows.append(_row("stale Xid not delivered", [d.summary for d in got][:2], quiet, "drained at the attempt's start"))

    # 6: a foreign holder of 10 % of GPU 0
    holder = Child(python, uuids[0], 0.10, False, work)
    other = run_gate(backend, cfg, (), env={"CUDA_VISIBLE_DEVICES": uuids[1]}) if count > 1 else None
    same = run_gate(backend, cfg, (), env=env0)
    holder.go()
    if other is not None:
        rows.append(_row("gate, foreign holder on another GPU", other.summary(), other.passed and other.waited_s < 1))
    else:
        rows.append(_row("gate, foreign holder on another GPU", "one GPU", None, "skipped"))
    rows.append(_row("gate, foreign holder on the job's GPU", same.summary(), not same.passed,
                     "the job's own GPU is busy: the gate waits, then refuses"))
    backend.shutdown()
    return rows


if __name__ == "__main__":
    for r in event_checks(sys.executable):
        print(r)
