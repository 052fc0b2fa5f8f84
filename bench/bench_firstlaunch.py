"""Issue 25 build 1: daemon exec -> job exec, the first launch's cost before the job runs at all.

The job is ``date +%s.%N`` (its exec time, printed by itself), run from an empty folder:

- ours: ``transformer-supervisor --log-format json wrap -- date +%s.%N`` at the defaults (state in
  ./.tsup/job, fresh each rep); beside the total, where the time goes, from the daemon's own event
  timestamps: exec -> the first event (interpreter and imports, config, state lock, ledger open),
  -> ``daemon_started`` (the concerns started), -> ``gate_passed`` (the pre-launch gate), ->
  the job's exec (the attempt's ledger row, cgroup, keeper, spawn);
- shell: ``bash -c 'until "$0" "$@"; do :; done' date +%s.%N``, the shell ``until`` loop's start.

"exec" is the bench's clock right before it spawns the process (the same fork + exec cost in
both arms). Arms interleaved per rep; medians of BENCH_FIRSTLAUNCH_REPS (15).
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
REPS = max(1, int(os.environ.get("BENCH_FIRSTLAUNCH_REPS", "15")))
JOB = ["date", "+%s.%N"]
STAGES = ("first event", "daemon_started", "gate_passed", "job exec")


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TSUP_")}


def _job_exec(stdout: str) -> float:
    return float(stdout.split()[-1])


def ours(cwd: Path) -> dict[str, float]:
    """One daemon run: seconds from its exec to each stage (STAGES)."""
    shutil.rmtree(cwd / ".tsup", ignore_errors=True)
    t0 = time.time()
    p = subprocess.run([PY, "-m", "supervisor", "--log-format", "json", "wrap", "--", *JOB], cwd=cwd,
                       capture_output=True, text=True, env=_env(), timeout=60)
    if p.returncode != 0:
        raise RuntimeError(f"wrap exited {p.returncode}: {p.stderr[-500:]}")
    at: dict[str, float] = {"job exec": _job_exec(p.stdout) - t0}
    for line in p.stderr.splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        ts = datetime.fromisoformat(ev["ts"].replace("Z", "+00:00")).timestamp() - t0
        at.setdefault("first event", ts)
        if ev.get("event") in STAGES:
            at.setdefault(ev["event"], ts)
    return at


def shell(cwd: Path) -> float:
    t0 = time.time()
    p = subprocess.run(["bash", "-c", 'until "$0" "$@"; do :; done', *JOB], cwd=cwd, capture_output=True,
                       text=True, env=_env(), timeout=60)
    return _job_exec(p.stdout) - t0


def _ms(v: float) -> float:
    return round(v * 1000, 1)


def run() -> list[dict]:
    runs: list[dict[str, float]] = []
    sh: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-firstlaunch-") as d:
        cwd = Path(d)
        for i in range(REPS):
            if i % 2:
                sh.append(shell(cwd))
                runs.append(ours(cwd))
            else:
                runs.append(ours(cwd))
                sh.append(shell(cwd))
    med = {s: statistics.median(r[s] for r in runs if s in r) for s in STAGES}
    how = f"median of {REPS}, interleaved; job `date +%s.%N`, cwd an empty folder"
    rows = [{"name": f"daemon exec -> job exec, ours `wrap` at the defaults ({how})", "value": _ms(med["job exec"]),
             "unit": "ms", "target": "report"},
            {"name": "daemon exec -> job exec, shell `until` loop (`bash -c 'until \"$0\" \"$@\"; do :; done' date ...`)",
             "value": _ms(statistics.median(sh)), "unit": "ms", "target": "peer"}]
    prev = 0.0
    for s in STAGES:
        what = {"first event": "exec -> first event (interpreter, imports, config, state lock, ledger)",
                "daemon_started": "-> daemon_started (run row, concerns started)",
                "gate_passed": "-> gate_passed (the pre-launch gate)",
                "job exec": "-> job exec (attempt row, cgroup, keeper, spawn)"}[s]
        rows.append({"name": f"  ours, {what}", "value": _ms(med[s] - prev), "unit": "ms", "target": "report"})
        prev = med[s]
    return rows


if __name__ == "__main__":
    for r in run():
        print(f"{r['name']}: {r['value']} {r['unit']}")
