"""Issue 25 build 3: a pre-warmed restart (``[job] prewarm = true``) against the shell ``until``
loop and our cold restart, on the recovery suite's unmodified nanoGPT-style job.

One SIGKILL at iter KILL_AT of ITERS (bench_recovery's one-kill scenario, its fault injection and
its timing: from the kill to the next launch's first ``iter N`` line). Arms, interleaved and
rotated from rep to rep, BENCH_PREWARM_REPS (3) reps, medians:

- prewarm: ``wrap`` at the defaults with a config of ``[job] prewarm = true``;
- cold: ``wrap`` at the defaults (bench_recovery's "ours");
- shell: ``until python peer_launch.py ...; do ...; done``.

With prewarm the job runs in our standby runner, whose argv names no training script: the
attempt to kill is the one the ledger says is running (its pid).
"""
from __future__ import annotations

import os
import sqlite3
import statistics
import sys
import tempfile
from pathlib import Path

import bench_recovery as rec

REPS = max(1, int(os.environ.get("BENCH_PREWARM_REPS", "3")))
PREWARM = "[job]\nprewarm = true\n"
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


def run() -> list[dict]:
    rec.job_pids = _job_pids
    rows: list[dict] = []

    def row(name: str, value: object, unit: str = "", target: str = "") -> None:
        rows.append({"name": name, "value": value, "unit": unit, "target": target})
        print(f"prewarm: {name}: {value}", file=sys.stderr, flush=True)

    arms = ["prewarm", "cold", "shell"]
    res: dict[str, list[rec.Result]] = {a: [] for a in arms}
    with tempfile.TemporaryDirectory(prefix="bench-prewarm-") as d:
        tmp = Path(d)
        for i in range(REPS):
            for arm in arms[i % len(arms):] + arms[:i % len(arms)]:
                kind = "shell" if arm == "shell" else "ours"
                r = rec.run_arm(tmp, kind, f"kill-{arm}", rec.ITERS, rec.EVAL, [("kill", rec.KILL_AT)],
                                config=PREWARM if arm == "prewarm" else None, tag=f"-{i}")
                res[arm].append(r)
    f2n: dict[str, list[float]] = {}
    for arm, rs in res.items():
        f2n[arm] = [r.fault_to_next[0][1] for r in rs if r.fault_to_next and r.fault_to_next[0][1] is not None]
    used = [a.get("prewarm") for r in res["prewarm"] for a in (r.history.get("attempts") or [])[1:]]
    row(f"settings: tests/trainer_scripts/nanogpt_train.py {' '.join(rec.MODEL)}, one SIGKILL at iter {rec.KILL_AT} of "
        f"{rec.ITERS}; prewarm: wrap with [job] prewarm = true; cold: wrap at the defaults; shell: bash until "
        f"loop; interleaved, {REPS} reps; load average at end {os.getloadavg()[0]:.1f} on "
        f"{len(os.sched_getaffinity(0))} cores; relaunches in the standby: {used.count('used')} of {len(used)}", "")
    for arm in arms:
        runs = ", ".join(f"{x:.2f}" for x in f2n[arm]) or "none"
        row(f"one SIGKILL: fault -> next iteration, {arm} (median; runs {runs})",
            round(statistics.median(f2n[arm]), 2) if f2n[arm] else "n/a", "s", "peer" if arm == "shell" else "report")
    if f2n["prewarm"] and f2n["shell"]:
        row("prewarm / shell loop, fault -> next iteration (medians)",
            round(statistics.median(f2n["prewarm"]) / statistics.median(f2n["shell"]), 2), "x", "<= 0.6")
    return rows
