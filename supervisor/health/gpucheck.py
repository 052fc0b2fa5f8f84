"""``scripts/gpu_check``: the checks that need a real NVIDIA GPU (none on the dev/CI machines).

1. The NVML monitor against the real devices for a few seconds: prints the snapshot (driver,
   CUDA, names, UUIDs, memory) and the per-GPU status, and the CPU it cost.
2. A real CUDA OOM under supervision: ``python -m supervisor wrap --max-restarts 1 --state-dir D
   -- python child.py``; attempt 0 allocates CUDA memory until ``torch.OutOfMemoryError``,
   attempt 1 measures free GPU memory at its start and exits 0. Then ``history --json`` must show
   cause ``oom`` for attempt 0 and a passed pre-launch gate for attempt 1, and the relaunched child
   must have found the memory released.

3. Issue 39's checks (:mod:`.gpuchecks`): events registered and what, MIG, the job's pids in NVML's
   lists, an application Xid raised by a child and attributed to it, a stale Xid not delivered to the
   next attempt, the gate with a foreign holder of GPU memory.

Prints a markdown table for BENCHMARKS.md, one pass/fail row per item; exits 0 when every check
passed, 1 otherwise.
Usage: ``python -m supervisor.health.gpucheck [--seconds 5] [--skip-oom] [--skip-events]``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

CHILD = textwrap.dedent("""\
    import json, os, sys, time
    import torch
    attempt = int(os.environ.get("TSUP_ATTEMPT", "0"))
    free, total = torch.cuda.mem_get_info()
    report = {"attempt": attempt, "free_bytes": free, "total_bytes": total, "t": time.time()}
    with open(os.path.join(sys.argv[1], f"attempt{attempt}.json"), "w") as f:
        json.dump(report, f)
    print(f"attempt {attempt}: {free / 2**30:.1f} of {total / 2**30:.1f} GiB free", flush=True)
    if attempt >= 1:
        print("relaunched after the OOM; exiting cleanly", flush=True)
        sys.exit(0)
    blocks = []
    chunk = 256 * 2**20
    while True:  # allocate until the CUDA caching allocator gives up: torch.OutOfMemoryError
        blocks.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
        if len(blocks) % 40 == 0:
            print(f"holding {len(blocks) * chunk / 2**30:.0f} GiB", flush=True)
    """)


# --simulate-oom: the same pipeline on a CPU machine (no torch): attempt 0 prints what a CUDA OOM
# prints and exits 1. Proves the script against the real daemon CLI; says nothing about a GPU.
CHILD_SIMULATED = textwrap.dedent("""\
    import json, os, sys, time
    attempt = int(os.environ.get("TSUP_ATTEMPT", "0"))
    with open(os.path.join(sys.argv[1], f"attempt{attempt}.json"), "w") as f:
        json.dump({"attempt": attempt, "free_bytes": 1, "total_bytes": 1, "t": time.time()}, f)
    print(f"attempt {attempt} (simulated)", flush=True)
    if attempt == 0:
        print("Traceback (most recent call last):", file=sys.stderr)
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 256.00 MiB. GPU 0 has a "
              "total capacity of 79.10 GiB of which 10.31 MiB is free.", file=sys.stderr, flush=True)
        sys.exit(1)
    """)


def _row(name: str, value: object, ok: bool | None, note: str = "") -> dict[str, Any]:
    return {"check": name, "value": value, "ok": ok, "note": note}


def nvml_check(seconds: float) -> list[dict[str, Any]]:
    from .config import GpuConfig
    from .nvml import NvmlBackend
    from .gpumonitor import GpuMonitor

    detections: list[Any] = []
    mon = GpuMonitor(NvmlBackend(), GpuConfig(poll_s=0.5))
    cpu0, wall0 = time.process_time(), time.monotonic()
    mon.start(None, detections.append)
    time.sleep(seconds)
    polls = mon.polls
    mon.stop()
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    snap, status = mon.snapshot(), mon.status()
    print("## NVML snapshot\n```json\n" + json.dumps(snap, indent=2) + "\n```")
    print("## GPU status\n```json\n" + json.dumps(status, indent=2, default=str) + "\n```")
    rows = [_row("nvml available", snap.get("available"), bool(snap.get("available")),
                 str(snap.get("reason") or ""))]
    if snap.get("available"):
        devs = snap.get("devices") or []
        rows += [
            _row("devices", len(devs), len(devs) > 0, ", ".join(sorted({str(d["name"]) for d in devs}))),  # type: ignore[arg-type, attr-defined]
            _row("driver / CUDA", f"{snap.get('driver')} / {snap.get('cuda')}", True),
            _row("monitor polls", polls, polls >= int(seconds / 0.5) - 2, f"in {wall:.1f} s"),
            _row("monitor CPU", f"{100 * cpu / wall:.2f} %", cpu / wall < 0.05, "poll 0.5 s, events thread on"),
            _row("detections while idle", len(detections), len(detections) == 0,
                 "; ".join(d.summary for d in detections)[:200]),
        ]
    return rows


def oom_check(python: str, timeout: float, simulate: bool = False) -> list[dict[str, Any]]:
    work = Path(tempfile.mkdtemp(prefix="tsup-gpucheck-"))
    state = work / "state"
    child = work / "child.py"
    child.write_text(CHILD_SIMULATED if simulate else CHILD)
    cmd = [python, "-m", "supervisor", "wrap", "--max-restarts", "1", "--state-dir", str(state),
           "--name", "gpu-check", "--", python, str(child), str(work)]
    print("## supervised CUDA OOM\n$ " + " ".join(cmd), flush=True)
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [_row("supervised OOM run", "timeout", False, f"no result in {timeout:.0f} s")]
    elapsed = time.monotonic() - t0
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
    print("```\n" + tail + "\n```")
    rows = [_row("wrap exit code", proc.returncode, proc.returncode == 0, f"{elapsed:.1f} s total")]
    hist_p = subprocess.run([python, "-m", "supervisor", "history", "--json", "--state-dir", str(state)],
                            capture_output=True, text=True, timeout=60)
    try:
        hist = json.loads(hist_p.stdout)
    except json.JSONDecodeError:
        return rows + [_row("history --json", "unreadable", False, (hist_p.stderr or hist_p.stdout)[-200:])]
    attempts = hist.get("attempts") or []
    first = attempts[0] if attempts else {}
    rows.append(_row("attempt 0 cause", first.get("cause"), first.get("cause") == "oom",
                     f"action {first.get('action')}"))
    second = attempts[1] if len(attempts) > 1 else None
    rows.append(_row("relaunched", len(attempts), second is not None))
    if second is not None:
        gate = second.get("gate") or {}
        rows.append(_row("gate before relaunch", gate.get("summary", "missing"), bool(gate.get("passed")),
                         f"waited {gate.get('waited_s')} s"))
        if first.get("ended_at") and second.get("started_at"):
            from datetime import datetime
            gap = (datetime.fromisoformat(second["started_at"]) - datetime.fromisoformat(first["ended_at"]))
            rows.append(_row("OOM exit -> relaunch", f"{gap.total_seconds():.2f} s", None, "includes backoff"))
    a0, a1 = work / "attempt0.json", work / "attempt1.json"
    if a0.exists() and a1.exists():
        r0, r1 = json.loads(a0.read_text()), json.loads(a1.read_text())
        frac = r1["free_bytes"] / r1["total_bytes"]
        base = r0["free_bytes"] / r0["total_bytes"]
        rows.append(_row("GPU memory free at relaunch", f"{frac:.1%} (was {base:.1%} before the OOM)",
                         frac >= base - 0.05))
    else:
        rows.append(_row("GPU memory free at relaunch", "no child report", False, str(work)))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--seconds", type=float, default=5.0, help="how long the NVML monitor runs")
    ap.add_argument("--skip-oom", action="store_true", help="no supervised CUDA OOM run")
    ap.add_argument("--skip-events", action="store_true", help="no issue 39 checks (events, Xid attribution, gate)")
    ap.add_argument("--oom-timeout", type=float, default=300.0)
    ap.add_argument("--simulate-oom", action="store_true",
                    help="CPU self-test of the OOM pipeline (no GPU, no torch): proves nothing about GPUs")
    args = ap.parse_args(argv)
    rows = nvml_check(args.seconds)
    if args.simulate_oom:
        rows += oom_check(sys.executable, args.oom_timeout, simulate=True)
    elif not args.skip_oom:
        try:
            import torch  # only to tell a CPU build from a CUDA one
            cuda = torch.cuda.is_available()
        except Exception as exc:
            cuda, why = False, f"torch unavailable: {exc}"
        else:
            why = "torch has no CUDA device (a CPU build?)"
        if cuda:
            rows += oom_check(sys.executable, args.oom_timeout)
        else:
            rows.append(_row("supervised CUDA OOM", "skipped", False, why))
    if not args.skip_events and not args.simulate_oom:
        from .gpuchecks import event_checks

        try:
            rows += event_checks(sys.executable)
        except Exception as exc:  # a check's bug is a failed row, the table still prints
            rows.append(_row("issue 39 checks", "crashed", False, repr(exc)[:200]))
    print("\n## gpu_check results\n\n| check | value | ok | note |\n|---|---|---|---|")
    for r in rows:
        ok = "-" if r["ok"] is None else ("yes" if r["ok"] else "**NO**")
        print(f"| {r['check']} | {r['value']} | {ok} | {str(r['note']).replace('|', '/')} |")
    failed = [r["check"] for r in rows if r["ok"] is False]
    print(f"\n{'all checks passed' if not failed else 'FAILED: ' + ', '.join(failed)} "
          f"(host {os.uname().nodename}, python {sys.version.split()[0]})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
