"""Pre-warmed restart (``[job] prewarm``, on by default since issue 38) on the recovery suite's
unmodified nanoGPT-style job: what the default costs and what it gives.

Arms, interleaved and rotated from rep to rep, BENCH_PREWARM_REPS (5) reps, medians:

- default: ``wrap`` at the defaults (prewarm on: the standby starts once the attempt has run
  STEADY_S past its first step, at idle priority);
- off: ``wrap`` with ``[job] prewarm = false`` (every restart cold);
- shell: ``until python peer_launch.py ...; do ...; done``.

Each run: one SIGKILL at iter KILL_AT of ITERS (BENCH_PREWARM_ITERS, 1800; KILL_AT at 3/4 of it),
late enough that the default's standby is up (bench_recovery's kill, at iter 150 of 600 about a
second after the first iteration, comes before any standby: that row's relaunch is cold). Rows:

- the first launch's start to its first iteration, default against off (the same runs, before
  the fault): the standby must never make the first launch slower;
- fault -> next iteration per arm, and goodput default against the shell loop (the same
  fault-free reference cancels: shell wall / default wall, within each rep);
- the waiting standby's resident memory and CPU seconds, read from ``status --json`` once its
  imports are done (its CPU unchanged for 1 s), BENCH_PREWARM_COST_REPS (3) runs.

The job runs in our standby runner with its own argv (argvarea.py), so the bench finds it by argv;
else the attempt the ledger says is running (its pid).
"""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bench_recovery as rec

REPS = max(1, int(os.environ.get("BENCH_PREWARM_REPS", "5")))
COST_REPS = max(1, int(os.environ.get("BENCH_PREWARM_COST_REPS", "3")))
ITERS = int(os.environ.get("BENCH_PREWARM_ITERS", "1800"))
KILL_AT = ITERS * 3 // 4
OFF = "[job]\nprewarm = false\n"
_by_argv = rec.job_pids


def _job_pids(out: Path) -> list[int]:
    """bench_recovery's search by argv, or else the running attempt's pid from our ledger."""
    found = _by_argv(out)
    ledger = out.parent / ".tsup" / "job" / "ledger.sqlite"
    if found or not ledger.exists():
        return found
    try:
        db = sqlite3.connect(f"file:{ledger}?mode=ro", uri=True, timeout=1.0)
        try:
            row = db.execute("SELECT pid FROM attempts WHERE ended_at IS NULL AND pid IS NOT NULL "
                             "ORDER BY attempt DESC LIMIT 1").fetchone()
        finally:
            db.close()
    except sqlite3.Error:
        return []
    return [int(row[0])] if row else []


def standby_cost(tmp: Path, i: int) -> dict | None:
    """One run at the defaults: the ``prewarm`` block of ``status`` once the standby is ready and
    its CPU seconds stopped growing (its imports done); None if that never came."""
    run = tmp / f"cost-{i}"
    out = run / "out"
    out.mkdir(parents=True)
    cmd = rec.command("ours", run, out, rec.train_args(out, ITERS * 4, rec.EVAL, []), None)
    proc = subprocess.Popen(cmd, cwd=run, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=rec.env(),
                            start_new_session=True)
    sd = run / ".tsup" / "job"
    last: dict | None = None
    found = None
    deadline = time.monotonic() + 120
    try:
        while found is None and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(1.0)
            cp = subprocess.run([rec.PY, "-m", "supervisor", "status", "--json", "--state-dir", str(sd)], cwd=run,
                                capture_output=True, text=True, env=rec.env(), timeout=30)
            try:
                block = json.loads(cp.stdout).get("prewarm") or {}
            except ValueError:
                continue
            if block.get("state") == "ready" and block.get("rss_bytes"):
                if last is not None and last.get("pid") == block.get("pid") and last.get("cpu_s") == block.get("cpu_s"):
                    found = block
                last = block
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return found


def run() -> list[dict]:
    rec.job_pids = _job_pids
    rows: list[dict] = []

    def row(name: str, value: object, unit: str = "", target: str = "") -> None:
        rows.append({"name": name, "value": value, "unit": unit, "target": target})
        print(f"prewarm: {name}: {value}", file=sys.stderr, flush=True)

    arms = ["default", "off", "shell"]
    res: dict[str, list[rec.Result]] = {a: [] for a in arms}
    with tempfile.TemporaryDirectory(prefix="bench-prewarm-") as d:
        tmp = Path(d)
        for i in range(REPS):
            for arm in arms[i % len(arms):] + arms[:i % len(arms)]:
                kind = "shell" if arm == "shell" else "ours"
                r = rec.run_arm(tmp, kind, f"kill-{arm}", ITERS, rec.EVAL, [("kill", KILL_AT)],
                                config=OFF if arm == "off" else None, tag=f"-{i}")
                res[arm].append(r)
        costs = [c for c in (standby_cost(tmp, i) for i in range(COST_REPS)) if c is not None]
    f2n: dict[str, list[float]] = {}
    for arm, rs in res.items():
        f2n[arm] = [r.fault_to_next[0][1] for r in rs if r.fault_to_next and r.fault_to_next[0][1] is not None]
    used = [a.get("prewarm") for r in res["default"] for a in (r.history.get("attempts") or [])[1:]]
    row(f"settings: tests/trainer_scripts/nanogpt_train.py {' '.join(rec.MODEL)}, one SIGKILL at iter {KILL_AT} of "
        f"{ITERS}; default: wrap at the defaults ([job] prewarm on); off: wrap with [job] prewarm = false; shell: "
        f"bash until loop; interleaved, {REPS} reps; load average at end {os.getloadavg()[0]:.1f} on "
        f"{len(os.sched_getaffinity(0))} cores; relaunches in the standby (default): {used.count('used')} of "
        f"{len(used)}", "")
    first = {arm: [r.first_iter_s for r in res[arm] if r.first_iter_s is not None] for arm in ("default", "off")}
    if first["default"] and first["off"]:
        on, off = statistics.median(first["default"]), statistics.median(first["off"])
        row("first launch: start to first iteration, prewarm on (default) / off (medians; runs "
            f"{', '.join(f'{x:.2f}' for x in first['default'])} / {', '.join(f'{x:.2f}' for x in first['off'])})",
            f"{on:.2f} / {off:.2f}", "s", "on <= off")
    for arm in arms:
        runs = ", ".join(f"{x:.2f}" for x in f2n[arm]) or "none"
        row(f"one SIGKILL: fault -> next iteration, {arm} (median; runs {runs})",
            round(statistics.median(f2n[arm]), 2) if f2n[arm] else "n/a", "s", "peer" if arm == "shell" else "report")
    if f2n["default"] and f2n["shell"]:
        row("default / shell loop, fault -> next iteration (medians)",
            round(statistics.median(f2n["default"]) / statistics.median(f2n["shell"]), 2), "x", "<= 0.6")
    done = [(r, s) for r, s in zip(res["default"], res["shell"]) if r.rc == 0 and s.rc == 0]
    if done:
        paired = [s.wall / r.wall for r, s in done]
        row("one SIGKILL: goodput default / shell loop within each rep (median; per rep: shell wall / default "
            f"wall, the fault-free reference cancels; {', '.join(f'{x:.3f}' for x in paired)})",
            round(statistics.median(paired), 3), "x", "> 1")
    if costs:
        rss = [c["rss_bytes"] / 2**20 for c in costs]
        cpu = [float(c["cpu_s"]) for c in costs]
        row(f"the waiting standby (imports done): resident memory, median of {len(costs)} "
            f"(runs {', '.join(f'{x:.0f}' for x in rss)})", round(statistics.median(rss)), "MiB", "report")
        row(f"the waiting standby: CPU seconds of its imports, median of {len(costs)} "
            f"(runs {', '.join(f'{x:.2f}' for x in cpu)})", round(statistics.median(cpu), 2), "s", "report")
    else:
        row("the waiting standby: memory and CPU", "n/a (no standby reached ready)", "", "report")
    return rows


if __name__ == "__main__":
    for r in run():
        print(f"| {r['name']} | {r['value']} | {r['unit']} | {r['target']} |")
