"""Soak (issue 12): one real daemon (``python -m supervisor run --config``), hundreds of restarts of
a fast-failing job; does the daemon leak fds, threads, zombie children or memory?

The job prints one training step past the last one (so every attempt made progress: the policy
relaunches at once, with the default 10 s backoff never applied) and exits 1. The config, named in
the rows: ``policy.max_restarts = 1000`` (the budget is not what is measured), everything else at
its default except ``gpu.backend = "none"`` (no GPU here) and no checkpoint dir (a failing job
that writes no checkpoint would otherwise give up as ``no_progress`` after 3 attempts).

Both samples are taken in the same phase: the job of attempt 10 (after 10 restarts, warmed) and
the one of attempt 10 + N hold (printing their step, then waiting for a file), so the daemon is
in its steady "running" state with one live job each time. Sampled from /proc: open fds, threads,
zombie children, RSS (VmRSS). N = BENCH_SOAK_RESTARTS (default 500).

``python bench/bench_soak.py`` prints the rows; ``run()`` returns them for scripts/bench.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
WARM = 10
RESTARTS = int(os.environ.get("BENCH_SOAK_RESTARTS", "500"))

# argv: COUNTER HOLDS LAST. Attempt n prints step 100n+1; at each of HOLDS (comma-separated) it
# waits for COUNTER.go<n>; attempt LAST exits 0, every other one 1.
JOB = """\
import os, sys, time
counter, hold, last = sys.argv[1], {int(h) for h in sys.argv[2].split(",")}, int(sys.argv[3])
n = int(open(counter).read()) if os.path.exists(counter) else 0
with open(counter, "w") as f:
    f.write(str(n + 1))
print('{"step": %d, "loss": 1.0}' % (100 * n + 1), flush=True)
if n in hold:
    open(counter + ".held%d" % n, "w").close()
    while not os.path.exists(counter + ".go%d" % n):
        time.sleep(0.005)
sys.exit(0 if n >= last else 1)
"""


def _status(pid: int) -> dict[str, str]:
    out: dict[str, str] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k] = v.strip()
    return out


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids += [int(p) for p in f.read().split()]
        except FileNotFoundError:
            continue
    return kids


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return "?"


def _sample_once(pid: int) -> dict[str, float]:
    st = _status(pid)
    kids = _children(pid)
    return {"fds": len(os.listdir(f"/proc/{pid}/fd")), "threads": int(st["Threads"]),
            "zombies": sum(1 for k in kids if _state(k) == "Z"), "children": len(kids),
            "rss_mb": int(st["VmRSS"].split()[0]) / 1024}


def sample(pid: int, n: int = 20, every_s: float = 0.05) -> dict[str, float]:
    """The smallest value of each figure over ``n`` looks ``every_s`` apart: a short-lived thread
    (a launch preparation finishing) is not growth; a leak is there in every look."""
    looks = []
    for _ in range(n):
        looks.append(_sample_once(pid))
        time.sleep(every_s)
    return {k: min(look[k] for look in looks) for k in looks[0]}


def _wait(cond, timeout: float, what: str, proc: subprocess.Popen, err: Path) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if proc.poll() is not None:
            raise RuntimeError(f"the daemon exited ({proc.returncode}) waiting for {what}: "
                               f"{err.read_text()[-2000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


def soak(restarts: int = RESTARTS, keep: Path | None = None) -> dict[str, Any]:
    """Run the soak; the samples at the warm, middle and last hold, the seconds between the
    first and the last hold, and how many relaunches waited for a backoff."""
    with tempfile.TemporaryDirectory(prefix="tsup-soak-") as tmp_s:
        tmp = keep or Path(tmp_s)
        counter, job = tmp / "counter", tmp / "job.py"
        job.write_text(JOB)
        holds = [WARM, WARM + restarts // 2, WARM + restarts]
        last = holds[-1]
        cfg = tmp / "soak.toml"
        argv = [PY, "-S", str(job), str(counter), ",".join(map(str, holds)), str(last)]
        cfg.write_text(f"[job]\nname = \"soak\"\ncommand = {json.dumps(argv)}\n[state]\ndir = \"{tmp / 'sd'}\"\n"
                       "[policy]\nmax_restarts = 1000\n[gpu]\nbackend = \"none\"\n")
        err = tmp / "daemon.stderr"
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "JOURNAL_STREAM")}
        proc = subprocess.Popen([PY, "-m", "supervisor", "--log-format", "logfmt", "run", "--config", str(cfg)],
                                cwd=str(ROOT), env=env, stdout=subprocess.DEVNULL, stderr=open(err, "wb"),
                                start_new_session=True)
        samples: list[dict[str, float]] = []
        seconds, released = 0.0, None  # restarting time only: the holds and the samples not counted
        try:
            for n in holds:
                _wait(Path(f"{counter}.held{n}").exists, 120 + 2.0 * restarts, f"attempt {n}", proc, err)
                if released is not None:
                    seconds += time.monotonic() - released
                samples.append(sample(proc.pid))
                Path(f"{counter}.go{n}").write_text("")
                released = time.monotonic()
            code = proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        if code != 0:
            raise RuntimeError(f"the daemon exited {code}: {err.read_text()[-2000:]}")
        scheduled = [line for line in err.read_text().splitlines() if line.startswith("event=restart_scheduled")]
        delayed = sum(1 for line in scheduled if "delay_s=0.0 " not in line)
        return {"samples": samples, "restarts": restarts, "scheduled": len(scheduled), "delayed": delayed,
                "seconds": seconds}


def run() -> list[dict[str, object]]:
    r = soak()
    b, m, a = r["samples"]
    n = r["restarts"]
    how = (f"one daemon, {n} restarts of a job that prints one new step and exits 1 (progress each time: "
           f"relaunched at once, the default backoff unused), sampled after {WARM} warm-up restarts and after "
           f"{WARM + n}; policy.max_restarts = 1000, gpu.backend = \"none\", no checkpoint dir, the rest default")
    return [
        {"name": f"daemon open fds, growth over the soak ({how}; {b['fds']} -> {a['fds']})",
         "value": a["fds"] - b["fds"], "unit": "fds", "target": "0"},
        {"name": f"daemon threads, growth, same run ({b['threads']} -> {a['threads']})",
         "value": a["threads"] - b["threads"], "unit": "threads", "target": "0"},
        {"name": f"daemon zombie children, growth, same run ({b['zombies']} -> {a['zombies']}; children, the "
                 f"held job included: {b['children']} -> {a['children']})",
         "value": a["zombies"] - b["zombies"], "unit": "zombies", "target": "0"},
        {"name": f"daemon RSS, growth, same run ({b['rss_mb']:.1f} -> {m['rss_mb']:.1f} -> {a['rss_mb']:.1f} MB)",
         "value": round(a["rss_mb"] - b["rss_mb"], 2), "unit": "MB", "target": "< 5"},
        {"name": f"daemon RSS, growth in the second {n - n // 2} restarts alone (a leak grows as much as in "
                 "the first half; a cache filling up does not)",
         "value": round(a["rss_mb"] - m["rss_mb"], 2), "unit": "MB", "target": "-"},
        {"name": f"relaunches that waited for a backoff, same run (of {r['scheduled']} scheduled)",
         "value": r["delayed"], "unit": "restarts", "target": "0"},
        {"name": "restarts per second, same run (exit seen, decided, old tree gone, gate, relaunched, first line)",
         "value": round(n / r["seconds"], 1), "unit": "restarts/s", "target": "-"},
    ]


if __name__ == "__main__":
    for row in run():
        print(f"{row['name']}\n    {row['value']} {row['unit']}  (target {row['target']})")
