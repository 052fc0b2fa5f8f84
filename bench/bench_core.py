"""Supervision core figures, each against a peer measured in the same run, each row naming its settings.

- restart overhead: the failing job's last act (a timestamp, then SIGKILL to itself) -> the next attempt's
  first act (a timestamp). The headline is ours at the defaults for a job that printed a new step
  before it died (progress: relaunched at once), against the shell loop a user writes first
  (``until python job.py; do :; done``) and ``torchrun --standalone --nproc-per-node=1
  --max-restarts=N`` (its default is 0: no restart; it has no backoff), the same script, raw gaps.
  Beside it, never instead: the defaults after an attempt without progress (the first restart
  waits ``policy.backoff_initial_s`` = 10 s, +-10 % jitter), ``--backoff 0`` (named), and the gaps
  net of the job interpreter's start-up (report only);
- RSS and CPU while the job prints 10k lines/s (``wrap`` at the defaults): the daemon's own pid,
  and the peak of its whole process tree except the job (everything it spawns: with a checkpoint
  dir, background verification runs a load-test child that imports torch), without and with a
  checkpoint dir; torchrun's agent and its tree except the worker, on the same job;
- pass-through and ingestion, end to end through the daemon on real log mixes where every line is a
  metric (nanoGPT's ``iter N: loss X ...``, a transformers 5.x Trainer's log dict): a job printing
  BENCH_PASS_LINES lines as fast as it can; its own wall time (start to its last write, taken by
  the job) under ``wrap`` at the defaults against under ``| tee file`` (the same two copies) and
  ``| cat`` (one), interleaved, median of BENCH_PASS_RUNS; wrap's whole run until every metric is
  in the ledger (end-to-end ingestion, daemon start-up included) against the job's own write rate,
  and the most the parsers were behind (they read a burst back from job.log: the job never waits
  for them). Every line on stdout and in job.log and every metric in the ledger is checked;
- a NaN after a burst: BENCH_PASS_LINES lines of the nanoGPT mix, then a NaN line; its wall time (taken by
  the job) -> the daemon's failure_detected event, median of BENCH_PASS_RUNS (the daemon still reading the
  burst back: the NaN is found ahead of the in-order parsers, job/catchup.LogAhead);
- detection latency: a NaN line written -> the daemon's failure_detected event;
- control replies under a metric flood: ``reload`` requests (answered by the main loop) while the
  daemon handles BENCH_FLOOD_LINES metric lines the job printed at full speed (from its first metric
  in the ledger to the last: the parsers' catch-up behind the job), against the same requests once
  it has caught up.

``python bench/bench_core.py`` prints the rows; ``run()`` returns them for scripts/bench.
Knobs: BENCH_RESTARTS (20), BENCH_DEFAULT_RESTARTS (2 runs of one restart at the defaults, ~10 s
each), BENCH_LATENCY_TRIALS (200), BENCH_PASS_LINES (1000000), BENCH_PASS_RUNS (3), BENCH_FLOOD_LINES (300000).
"""
from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
RESTARTS = int(os.environ.get("BENCH_RESTARTS", "20"))
DEFAULT_RESTARTS = int(os.environ.get("BENCH_DEFAULT_RESTARTS", "2"))
PASS_LINES = int(os.environ.get("BENCH_PASS_LINES", "1000000"))
FLOOD_LINES = int(os.environ.get("BENCH_FLOOD_LINES", "300000"))
PASS_RUNS = int(os.environ.get("BENCH_PASS_RUNS", "3"))

STAMP_JOB = """\
import time, os, sys
t0 = time.time()
path = sys.argv[1]
with open(path, "a") as f:
    f.write(f"start {t0:.6f}\\n")
n = sum(1 for l in open(path) if l.startswith("start"))
if n > int(sys.argv[2]):
    sys.exit(0)
if len(sys.argv) > 3:
    # A new step each attempt: the attempt made progress, which the supervisor relaunches at once
    # (a training job that crashes mid-run). Without it, the attempt shows no progress.
    print(f"step {n} loss 2.0", flush=True)
with open(path, "a") as f:
    f.write(f"exit {time.time():.6f}\\n")
# Killed (SIGKILL), not exit 1: the same exit 1 at the same place with the same argv is a
# deterministic failure that the supervisor gives up on at the second try (no futile repeats).
os.kill(os.getpid(), 9)
"""

# Prints RATE lines/s for SECONDS; with a folder, also saves a small torch checkpoint there every
# 2 s (step_N.pt), so that the daemon's background verification has something to verify.
PRINT_JOB = """\
import os, sys, time
rate, seconds = int(sys.argv[1]), float(sys.argv[2])
ckdir = sys.argv[3] if len(sys.argv) > 3 else None
if ckdir:
    import torch
    weights = {"w": torch.randn(1024, 1024)}
t0 = time.monotonic(); i = 0; next_ck = 1.0
w = sys.stdout.write
while True:
    now = time.monotonic() - t0
    if now >= seconds: break
    target = int(now * rate)
    while i < target:
        w(f"step {i} loss {2.0 + (i % 7) * 0.01:.4f} the quick brown fox jumps over the lazy dog\\n"); i += 1
    sys.stdout.flush()
    if ckdir and now >= next_ck:
        torch.save({"model": weights, "step": i}, os.path.join(ckdir, f"step_{i}.pt"))
        next_ck += 2.0
    time.sleep(0.005)
"""

def _row(name: str, value: object, unit: str, target: object = "report") -> dict:
    return {"name": name, "value": value, "unit": unit, "target": target}


def _torchrun() -> str | None:
    return shutil.which("torchrun", path=str(Path(PY).parent)) or shutil.which("torchrun")


def _gaps(stamps: Path) -> list[float]:
    lines = stamps.read_text().split("\n")
    gaps = []
    last_exit = None
    for l in lines:
        if l.startswith("exit "):
            last_exit = float(l.split()[1])
        elif l.startswith("start ") and last_exit is not None:
            gaps.append(float(l.split()[1]) - last_exit)
            last_exit = None
    return gaps


def interpreter_startup(job: Path, tmp: Path, n: int = 15) -> float:
    """Median seconds from spawning the job's interpreter to its first line: common to every
    supervisor; the net figures subtract it."""
    samples = []
    for i in range(n):
        stamps = tmp / f"startup{i}.txt"
        t0 = time.time()
        subprocess.run([PY, str(job), str(stamps), "0"], check=False)
        samples.append(float(stamps.read_text().split()[1]) - t0)
    return statistics.median(samples)


def _ours_restarts(tmp: Path, job: Path, tag: str, restarts: int, extra: list[str],
                   progress: bool = False) -> tuple[list[float], list[float]]:
    """Gaps (s) of one daemon run whose job fails ``restarts`` times, and the delays the daemon
    scheduled for them (its restart_scheduled events)."""
    import json

    stamps, sd, log = tmp / f"{tag}.txt", tmp / f"sd-{tag}", tmp / f"{tag}.log"
    with open(log, "w") as err:
        subprocess.run([PY, "-m", "supervisor", "--log-format", "json", "wrap", "--state-dir", str(sd), *extra, "--",
                        PY, str(job), str(stamps), str(restarts), *(["progress"] if progress else [])], cwd=ROOT,
                       stdout=subprocess.DEVNULL, stderr=err, timeout=600, check=True)
    delays = [json.loads(l).get("delay_s") or 0.0 for l in log.read_text().splitlines()
              if '"restart_scheduled"' in l]
    return _gaps(stamps), delays


def _shell_restarts(tmp: Path, job: Path, restarts: int) -> list[float]:
    """The peer a user writes first: ``until python job.py ...; do :; done`` (no delay, no limit)."""
    stamps = tmp / "shell.txt"
    subprocess.run(["bash", "-c", 'until "$0" "$@"; do :; done', PY, str(job), str(stamps), str(restarts),
                    "progress"], cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600,
                   check=True)
    return _gaps(stamps)


def restart_overhead(tmp: Path) -> list[dict]:
    """Headline: ours at the defaults against the shell ``until`` loop and torchrun, on raw gaps, for a job
    that made progress before it died (the common case; relaunched at once at the defaults). Beside it:
    the defaults after an attempt without progress (the 10 s backoff), ``--backoff 0`` (not a default),
    and the gaps net of the interpreter's start-up (report only: small differences of noisy figures)."""
    job = tmp / "stamp_job.py"
    job.write_text(STAMP_JOB)
    startup = interpreter_startup(job, tmp)
    med = statistics.median
    rows = [_row("job interpreter start-up (python to its first line; common to every supervisor)",
                 round(startup * 1000, 1), "ms", "common")]
    # At the defaults, max_restarts is 10: the restarts are split over daemon runs of at most 10 each.
    ours: list[float] = []
    done, k = 0, 0
    while done < RESTARTS:
        n = min(10, RESTARTS - done)
        g, _ = _ours_restarts(tmp, job, f"progress{k}", n, [], progress=True)
        ours += g
        done, k = done + n, k + 1
    shell = _shell_restarts(tmp, job, RESTARTS)
    torchrun = _torchrun()
    tg: list[float] = []
    if torchrun:
        theirs = tmp / "torchrun.txt"
        subprocess.run([torchrun, "--standalone", "--nproc-per-node=1", f"--max-restarts={RESTARTS + 1}",
                        str(job), str(theirs), str(RESTARTS), "progress"], cwd=tmp, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=900)
        tg = _gaps(theirs)
    o, s = med(ours), med(shell)
    how = "the job prints a new step, then SIGKILLs itself"
    rows += [_row(f"restart, ours at the defaults ({how}: progress, so relaunched at once): job exit -> next start, "
                  f"raw gap (median of {len(ours)}; daemon runs of <= 10 restarts, max_restarts' default)",
                  round(o * 1000, 1), "ms", "report"),
             _row(f"restart, shell `until python job.py; do :; done`, same script: raw gap (median of {len(shell)}) "
                  "(peer)", round(s * 1000, 1), "ms", "peer")]
    if tg:
        t = med(tg)
        rows.append(_row(f"restart, torchrun --standalone --nproc-per-node=1 --max-restarts={RESTARTS + 1} (its "
                         f"default is 0; no backoff), same script: raw gap (median of {len(tg)}) (peer)",
                         round(t * 1000, 1), "ms", "peer"))
    else:
        rows.append(_row("torchrun (peer)", "not installed" if not torchrun else "no restart recorded", "", "peer"))
    rows.append(_row("restart ratio ours at the defaults / shell until loop, raw gaps", round(o / s, 3), "x", "<= 1"))
    if tg:
        rows.append(_row("restart ratio ours at the defaults / torchrun, raw gaps", round(o / med(tg), 3), "x",
                         "<= 0.3"))
    # Beside the headline, not instead of it.
    gaps, delays = [], []
    for k in range(DEFAULT_RESTARTS):
        g, dl = _ours_restarts(tmp, job, f"defaults{k}", 1, [])
        gaps += g
        delays += dl[:len(g)]
    if gaps:
        rows += [_row("beside: restart, ours at the defaults after an attempt WITHOUT progress (no step printed: waits "
                      "policy.backoff_initial_s = 10 s, +-10 % jitter): raw gap (median of "
                      f"{len(gaps)})", round(med(gaps), 2), "s", "report"),
                 _row("beside: same / shell until loop (which never waits), raw gaps", round(med(gaps) / s, 1), "x",
                      "report")]
    g0, _ = _ours_restarts(tmp, job, "backoff0", min(RESTARTS, 10), ["--backoff", "0"])
    b0 = med(g0)
    rows += [_row(f"beside: restart, ours with --backoff 0 (NOT the default), job without progress: raw gap (median of "
                  f"{len(g0)})", round(b0 * 1000, 1), "ms", "report"),
             _row("beside: ours --backoff 0 / shell until loop, raw gaps", round(b0 / s, 3), "x", "report")]
    net = f"ours at the defaults {(o - startup) * 1000:.1f} / shell {(s - startup) * 1000:.1f}"
    if tg:
        net += f" / torchrun {(med(tg) - startup) * 1000:.1f}"
    rows.append(_row("report only, not a headline: the same raw gaps net of the job interpreter's start-up "
                     "(subtracting a noisy common figure from small ones)", net, "ms", "report"))
    return rows


def _what(argv: list[str]) -> str:
    text = " ".join(argv)
    if "--serve" in argv[-1:] and "-c" in argv:
        return "the warm load-test verifier (python -c ... --serve, imports torch once)"
    if "TSUP_LOADTEST_RESULT" in text:
        return "a one-off load-test child (python -c, imports torch)"
    if "-c" in argv[1:2]:
        return "the job environment probe (python -c)"
    return " ".join([Path(argv[0]).name, *argv[1:2]])[:50] if argv else "?"


class TreeSampler:
    """Samples a supervisor's pid and its process tree, less the job's own subtree (the job is the
    same under every supervisor). Peak RSS is the largest sum over one sample; CPU is summed over
    every process seen (each one's last reading)."""

    def __init__(self, root: psutil.Process, job_marker: str) -> None:
        self.root, self.marker = root, job_marker
        self.peak_root = 0
        self.peak_tree = 0
        self.cpu: dict[int, float] = {}
        self.cpu0: dict[int, float] = {}
        self.seen: set[str] = set()

    def _helpers(self) -> list[psutil.Process]:
        skip: set[int] = set()
        try:
            kids = self.root.children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        for p in kids:
            try:
                if self.marker in " ".join(p.cmdline()):
                    skip.add(p.pid)
                    skip.update(c.pid for c in p.children(recursive=True))
            except psutil.Error:
                skip.add(p.pid)
        return [p for p in kids if p.pid not in skip]

    def sample(self) -> bool:
        try:
            rss = self.root.memory_info().rss
            t = self.root.cpu_times()
        except psutil.NoSuchProcess:
            return False
        self.peak_root = max(self.peak_root, rss)
        self.cpu[self.root.pid] = t.user + t.system
        self.cpu0.setdefault(self.root.pid, t.user + t.system)
        tree = rss
        for p in self._helpers():
            try:
                tree += p.memory_info().rss
                ct = p.cpu_times()
                self.cpu[p.pid] = ct.user + ct.system + ct.children_user + ct.children_system
                self.cpu0.setdefault(p.pid, 0.0)  # a helper started during the window counts whole
                what = _what(p.cmdline())
                if what != "?":  # a child between its fork and its exec
                    self.seen.add(what)
            except psutil.Error:
                continue
        self.peak_tree = max(self.peak_tree, tree)
        return True

    def run(self, seconds: float) -> "TreeSampler":
        t0 = time.monotonic()
        self.wall = 0.0
        while time.monotonic() - t0 < seconds and self.sample():
            time.sleep(0.05)
        self.wall = time.monotonic() - t0
        return self

    def cpu_percent(self, root_only: bool) -> float:
        pids = [self.root.pid] if root_only else list(self.cpu)
        used = sum(self.cpu[p] - self.cpu0.get(p, 0.0) for p in pids if p in self.cpu)
        return 100.0 * used / max(self.wall, 1e-9)


def rss_and_cpu(tmp: Path) -> list[dict]:
    """Headline: the peak RSS of everything the daemon spawns except the job (load-test children
    included) with a checkpoint dir, against torchrun's agent and everything it spawns except the
    worker, on the same checkpointing job; the daemon's own pid beside it; then without a checkpoint dir."""
    job = tmp / "print_job.py"
    job.write_text(PRINT_JOB)
    found: dict[bool, TreeSampler] = {}
    helpers: dict[bool, str] = {}
    for with_ck in (True, False):
        seconds = 10.0 if with_ck else 6.0
        sd, ck = tmp / f"sd-rss-{with_ck}", tmp / f"ck-rss-{with_ck}"
        ck.mkdir()
        argv = [PY, "-m", "supervisor", "--log-format", "logfmt", "wrap", "--state-dir", str(sd)]
        job_argv = [PY, str(job), "10000", str(seconds)]
        if with_ck:
            argv += ["--checkpoint-dir", str(ck)]
            job_argv.append(str(ck))
        p = subprocess.Popen([*argv, "--", *job_argv], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # the daemon's own start-up is not steady state
        found[with_ck] = TreeSampler(psutil.Process(p.pid), str(job)).run(seconds + (6.0 if with_ck else -1.5))
        p.wait(120)
        helpers[with_ck] = ", ".join(sorted(found[with_ck].seen)) or "none seen"
    peer: TreeSampler | None = None
    torchrun = _torchrun()
    if torchrun:  # the same job, saving the same checkpoints (torchrun's agent does nothing with them)
        seconds = 10.0
        ck = tmp / "ck-rss-torchrun"
        ck.mkdir()
        t = subprocess.Popen([torchrun, "--standalone", "--nproc-per-node=1", str(job), "10000", str(seconds), str(ck)],
                             cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.5)
        peer = TreeSampler(psutil.Process(t.pid), str(job)).run(seconds - 2.0)
        t.wait(60)
    mib = lambda b: round(b / 2**20, 1)  # noqa: E731
    ck_label = "with a checkpoint dir, the job saving a 4 MB torch checkpoint every 2 s"
    ours = found[True]
    rows = [_row(f"memory, ours at the defaults: peak RSS of the daemon + everything it spawns except the job, "
                 f"{ck_label} (load-test children included; sampled every 50 ms; seen: {helpers[True]})",
                 mib(ours.peak_tree), "MiB", "report")]
    if peer is not None:
        rows += [_row("memory, torchrun's agent + everything it spawns except the worker, same job and saves, peak RSS "
                      "(peer)", mib(peer.peak_tree), "MiB", "peer"),
                 _row("memory ratio ours (daemon + its children) / torchrun (agent + its children)",
                      round(ours.peak_tree / max(1, peer.peak_tree), 2), "x", "<= 1")]
    rows += [_row(f"beside: daemon peak RSS, its own pid alone, {ck_label}", mib(ours.peak_root), "MiB", "<= 55")]
    if peer is not None:
        rows.append(_row("beside: torchrun agent peak RSS, its own pid alone (peer)", mib(peer.peak_root), "MiB",
                         "peer"))
    bare = found[False]
    rows += [_row(f"memory, ours, no checkpoint dir: daemon + everything it spawns except the job, peak RSS "
                  f"(seen: {helpers[False]})", mib(bare.peak_tree), "MiB", "report"),
             _row("beside: same, the daemon's own pid alone", mib(bare.peak_root), "MiB", "<= 55")]
    for with_ck, label in ((True, ck_label), (False, "no checkpoint dir")):
        s = found[with_ck]
        rows += [_row(f"CPU, daemon + everything it spawns except the job, {label} (job prints 10k lines/s)",
                      round(s.cpu_percent(False), 1), "% of a core", "report"),
                 _row(f"beside: same, the daemon's own pid, {label}", round(s.cpu_percent(True), 1), "% of a core",
                      "report")]
    if peer is not None:
        rows += [_row("CPU, torchrun agent + everything it spawns except the worker, same job (peer)",
                      round(peer.cpu_percent(False), 1), "% of a core", "peer")]
    return rows


# Every line a metric, as fast as Python prints: nanoGPT's own log line, or the dict a transformers
# 5.x Trainer prints at each logging step (tests/corpus/hf5_filter_on.stdout). The job's own wall
# time (its start to its last write flushed) goes into argv[3].
MIX_JOB = """\
import sys, time
t0, wall0 = time.monotonic(), time.time()
w = sys.stdout.write
fmt, n = sys.argv[1], int(sys.argv[2])
if fmt == "nanogpt":
    for i in range(n):
        w(f"iter {i}: loss {2.0 + (i % 97) * 0.001:.4f}, time 12.34ms, mfu 1.20%\\n")
else:
    for i in range(n):
        w(f"{{'loss': '{3.9 - (i % 97) * 0.001:.4g}', 'grad_norm': '1.543', 'learning_rate': '4.333e-05', "
          f"'epoch': '{i / n:.4f}'}}\\n")
sys.stdout.flush()
open(sys.argv[3], "w").write(f"{time.monotonic() - t0:.4f} {wall0:.6f}")
"""
MIXES = (("nanogpt", "nanoGPT `iter N: loss X, time T, mfu M`"),
         ("hf", "transformers 5.x Trainer `{'loss': ..., 'grad_norm': ..., 'learning_rate': ..., 'epoch': ...}`"))


def passthrough(tmp: Path, mixes: tuple[tuple[str, str], ...] = MIXES) -> list[dict]:
    """End to end through the daemon on a real log mix, every line a metric: the job's own wall time
    under ``wrap`` at the defaults against under ``| tee file`` (the same two copies) and ``| cat`` (one),
    interleaved, median of PASS_RUNS; the daemon's ingestion end to end (lines until the last metric is
    in the ledger / its whole run, start-up included) against the rate the job writes under tee; the
    most the parsers were behind. Every line in job.log and every metric in the ledger is checked."""
    import json
    import sqlite3

    n, job, took = PASS_LINES, tmp / "mix_job.py", tmp / "mix.took"
    job.write_text(MIX_JOB)
    med = statistics.median
    k = f"{n / 1e6:g}M" if n >= 10**6 else str(n)
    how = f"median of {PASS_RUNS} interleaved"
    rows: list[dict] = []
    for fmt, what in mixes:
        times: dict[str, list[float]] = {"cat": [], "tee": [], "wrap": [], "whole": [], "lag": [], "read": [],
                                         "tee_read": []}
        for r in range(PASS_RUNS):
            for peer in (["cat"], ["tee", str(tmp / "mix.tee.log")]):
                with open(tmp / "mix.out", "wb") as f:
                    a = subprocess.Popen([PY, str(job), fmt, str(n), str(took)], stdout=subprocess.PIPE)
                    subprocess.run(peer, stdin=a.stdout, stdout=f, check=True)
                    peer_done = time.time()  # tee has read the last line: it exits at EOF
                    a.wait()
                own, wall0 = map(float, took.read_text().split())
                times[peer[0]].append(own)
                if peer[0] == "tee":
                    times["tee_read"].append(peer_done - wall0)
            sd = tmp / f"sd-mix-{fmt}{r}"
            t0 = time.monotonic()
            with open(tmp / "mix.out", "wb") as f, open(tmp / "mix.err", "wb") as e:
                subprocess.run([PY, "-m", "supervisor", "--log-format", "json", "wrap", "--state-dir", str(sd), "--",
                                PY, str(job), fmt, str(n), str(took)], cwd=ROOT, stdout=f, stderr=e, check=True)
            times["whole"].append(time.monotonic() - t0)
            own, wall0 = map(float, took.read_text().split())
            times["wrap"].append(own)
            assert sum(1 for _ in open(tmp / "mix.out", "rb")) == n, "stdout is missing lines"
            assert sum(1 for _ in open(sd / "job.log", "rb")) == n, "job.log is missing lines"
            db = sqlite3.connect(sd / "ledger.sqlite")
            try:
                booked, last_read = db.execute("SELECT COUNT(*), MAX(at) FROM metrics").fetchone()
            finally:
                db.close()
            assert booked == n, f"{fmt}: {booked} of {n} metrics in the ledger"
            times["read"].append(last_read - wall0)  # a record's time is stamped as its line is read
            events = [json.loads(x) for x in (tmp / "mix.err").read_text().splitlines() if x.startswith("{")]
            times["lag"].append(max([ev.get("max_lag_s", 0.0) for ev in events
                                     if ev.get("event") == "output_caught_up"] or [0.0]))
        m = {key: med(v) for key, v in times.items()}
        # The headline: the job's start until the daemon has read its last line (a record is stamped
        # as its line is read), against until tee has (tee reads as the job writes); the job's own
        # wall time is beside it, since the job never waits for the daemon.
        rows += [_row(f"pass-through, {fmt}: a job printing {k} lines, every one a metric ({what}), as fast as it can: "
                      f"its start -> the daemon has read its last line, wrap at the defaults (stdout + state-dir "
                      f"job.log; {how}; every line in both, every metric in the ledger)", round(m["read"], 2), "s",
                      "report"),
                 _row(f"same job, {fmt}: its start -> tee file has read its last line (tee exits) (peer)",
                      round(m["tee_read"], 2), "s", "peer"),
                 _row(f"pass-through, {fmt}: until the last line is read, wrap / tee", round(m["read"] / m["tee_read"], 2),
                      "x", "<= 1.5"),
                 _row(f"beside: {fmt}, the job's own wall time under wrap (its start to its last write; it never waits "
                      "for the daemon)", round(m["wrap"], 2), "s", "report"),
                 _row(f"same job, {fmt}, through | tee file (the same two copies): its own wall time (peer)",
                      round(m["tee"], 2), "s", "peer"),
                 _row(f"same job, {fmt}, through | cat (one copy): its own wall time (peer)", round(m["cat"], 2), "s",
                      "peer"),
                 _row(f"beside: {fmt}, the job's own wall time under wrap / under tee", round(m["wrap"] / m["tee"], 2),
                      "x", "report"),
                 _row("beside: same / under cat", round(m["wrap"] / m["cat"], 2), "x", "report"),
                 _row(f"ingestion end to end, {fmt}: lines / wrap's whole run until the last metric is in the ledger "
                      f"(daemon start-up included; the job's own write rate under tee: {n / m['tee']:,.0f} lines/s)",
                      round(n / m["whole"]), "lines/s", "report"),
                 _row(f"ingestion end to end, {fmt}: ours / the job's write rate under tee", round(m["tee"] / m["whole"], 3),
                      "x", "report"),
                 _row(f"beside: {fmt}, the most the parsers were behind the job (they read a burst back from job.log: "
                      "the job never waits for them)", round(m["lag"], 1), "s", "report")]
    return rows


# The burst of the nanoGPT mix, then its NaN line: bench/jobs/burst_nan.py (the e2e test runs it too).
BURST_NAN_JOB = ROOT / "bench" / "jobs" / "burst_nan.py"


def burst_nan(tmp: Path) -> list[dict]:
    """A NaN printed right after a PASS_LINES burst of the nanoGPT mix: its wall time (taken by the job)
    to the daemon's failure_detected event (the daemon's own timestamp), median of PASS_RUNS; the daemon
    is still reading the burst back then, and the in-order parsers would reach the NaN only after every
    line before it (job/catchup.LogAhead looks ahead of them for non-finite values)."""
    import datetime
    import json

    n, job, printed = PASS_LINES, BURST_NAN_JOB, tmp / "burst_nan.at"
    k = f"{n / 1e6:g}M" if n >= 10**6 else f"{n:,}"
    took: list[float] = []
    for r in range(PASS_RUNS):
        sd = tmp / f"sd-burst-nan{r}"
        with open(tmp / "burst_nan.err", "wb") as e:
            subprocess.run([PY, "-m", "supervisor", "--log-format", "json", "wrap", "--state-dir", str(sd), "--set",
                            "on.nan.action=give_up", "--", PY, str(job), str(n), str(printed)], cwd=ROOT,
                           stdout=subprocess.DEVNULL, stderr=e, timeout=900)
        events = [json.loads(x) for x in (tmp / "burst_nan.err").read_text().splitlines() if x.startswith("{")]
        [det] = [ev for ev in events if ev.get("event") == "failure_detected"]
        assert det["step"] == n, det
        at = datetime.datetime.fromisoformat(det["ts"].replace("Z", "+00:00")).timestamp()
        took.append(at - float(printed.read_text()))
        hist = json.loads(subprocess.run([PY, "-m", "supervisor", "history", "--json", "--state-dir", str(sd)],
                                         cwd=ROOT, capture_output=True, check=True).stdout)
        found = hist["attempts"][0]["detection"]
        assert found["details"].get("found_ahead_of_parsing"), found
    return [_row(f"NaN after a {k}-line burst (nanoGPT mix, every line a metric, printed as fast as it can): the "
                 f"job's NaN line -> the daemon's failure_detected, median of {PASS_RUNS} (found ahead of the "
                 "in-order parsers, which are still reading the burst back)", round(statistics.median(took), 2),
                 "s", "<= 5")]


# Each attempt's NaN at another step (100 apart): an identical repeat (same cause, step, checkpoint,
# argv) is given up on at the second occurrence, which would end the trials after two.
NAN_JOB = """\
import json, os, sys, time
base = 100 * int(os.environ.get("TSUP_ATTEMPT", "0"))
print(json.dumps({"step": base + 1, "loss": 2.0}), flush=True)
time.sleep(0.05)
sys.stdout.write(json.dumps({"step": base + 2, "loss": float("nan"), "t": time.time()}) + "\\n")
sys.stdout.flush()
time.sleep(30)
"""


def detection_latency(tmp: Path) -> list[dict]:
    """Line written by the job -> the daemon's failure_detected event, over many attempts."""
    import datetime

    trials = int(os.environ.get("BENCH_LATENCY_TRIALS", "200"))
    job = tmp / "nan_job.py"
    job.write_text(NAN_JOB)
    sd = tmp / "sd-latency"
    cfg = tmp / "latency.toml"
    # Not the defaults, named in the rows: the trials follow each other (backoff 0, a restart on a
    # NaN instead of a rollback with nowhere to go); detection itself does not depend on either.
    cfg.write_text(f"[policy]\nmax_restarts = {trials}\nbackoff_initial_s = 0\n[shutdown]\ngrace_s = 5\n"
                   "[on.nan]\naction = \"restart\"\n")
    log = tmp / "latency.log"
    with open(log, "w") as f:
        subprocess.run([PY, "-m", "supervisor", "--log-format", "json", "wrap", "--config", str(cfg), "--state-dir",
                        str(sd), "--", PY, str(job)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=f, timeout=1200)
    import json

    stamps = []
    for line in (tmp / "sd-latency" / "job.log").read_text().splitlines():
        if '"t":' in line:
            stamps.append(json.loads(line.replace("NaN", "null"))["t"])
    detected = []
    for line in log.read_text().splitlines():
        if '"failure_detected"' in line:
            ev = json.loads(line)
            stamp = ev.get("timestamp") or ev.get("ts")  # the key was renamed once
            detected.append(datetime.datetime.fromisoformat(stamp).timestamp())
    lat = sorted((d - t) * 1000 for t, d in zip(stamps, detected))
    if not lat:
        return [{"name": "detection latency (end to end)", "value": "no data", "unit": "", "target": ""}]
    p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]  # noqa: E731
    how = f"({len(lat)} trials; on.nan = restart, backoff 0 so trials follow each other)"
    return [_row(f"detection latency, job writes a NaN line -> decision logged, p50 {how}", round(p(0.5), 2), "ms"),
            _row(f"detection latency, job writes a NaN line -> decision logged, p99 {how}", round(p(0.99), 2), "ms",
                 "<= 50")]


FLOOD_JOB = """\
import sys, time
n = int(sys.argv[1])
w = sys.stdout.write
for i in range(n):
    w(f"step {i} loss 1.{i % 7}\\n")
sys.stdout.flush()
open(sys.argv[2], "w").write("1")
time.sleep(600)
"""


def _reply_s(state_dir: Path, verb: str) -> float:
    """One control request through the client the CLI uses (what `transformer-supervisor reload`
    does); its reply time."""
    from supervisor.ops.controlclient import request

    t = time.monotonic()
    request(state_dir, verb, timeout=30)
    return time.monotonic() - t


def _last_step(state_dir: Path) -> int:
    """The newest step the daemon has put in its ledger (-1 before the first): how far its
    parsers have caught up with the job."""
    import sqlite3

    try:
        db = sqlite3.connect(f"file:{state_dir / 'ledger.sqlite'}?mode=ro", uri=True, timeout=5)
        try:
            row = db.execute("SELECT max(step) FROM metrics").fetchone()
        finally:
            db.close()
    except sqlite3.Error:  # not made yet
        return -1
    return -1 if row is None or row[0] is None else int(row[0])


def control_under_flood(tmp: Path) -> list[dict]:
    """Control replies that go through the main loop (``reload``) while the daemon handles a burst
    of metric lines the job printed as fast as Python can: the job's burst takes a fraction of a
    second (the keeper never holds it back), the daemon's parsers and ledger then catch up for
    seconds from job.log, and a user's request comes during that catch-up. Timed from the
    daemon's first metric in its ledger (its start-up is not the flood) to the last one; against
    the same requests to the same daemon once it has caught up."""
    n = FLOOD_LINES
    job, done, sd = tmp / "flood_job.py", tmp / "flood.done", tmp / "sd-flood"
    job.write_text(FLOOD_JOB)
    d = subprocess.Popen([PY, "-m", "supervisor", "wrap", "--state-dir", str(sd), "--", PY, str(job), str(n),
                          str(done)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while _last_step(sd) < 0:
            assert time.monotonic() < deadline and d.poll() is None, "the daemon put no metric in its ledger"
            time.sleep(0.01)
        flood: list[float] = []
        t0 = time.monotonic()
        while _last_step(sd) < n - 1:
            assert time.monotonic() < deadline + 300 and d.poll() is None, "the daemon did not catch up"
            flood.append(_reply_s(sd, "reload"))
            time.sleep(0.02)
        catch_up = time.monotonic() - t0
        idle = [_reply_s(sd, "reload") for _ in range(50)]
    finally:
        d.terminate()
        d.wait(30)
    flood.sort()
    idle.sort()
    k = f"{n // 1000}k"
    return [_row(f"control reply (reload, through the main loop) while the daemon handles a {k}-line burst of metric "
                 f"lines (the job printed them at full speed; its parsers and ledger caught up in {catch_up:.1f} s), "
                 f"p50 ({len(flood)} requests)", round(flood[len(flood) // 2] * 1000, 1) if flood else "none", "ms"),
            _row(f"same, worst of {len(flood)}", round(flood[-1] * 1000, 1) if flood else "none", "ms", "<= 100"),
            _row("same requests to the same daemon once it has caught up, p50 (peer: no flood)",
                 round(idle[len(idle) // 2] * 1000, 1), "ms", "peer")]


PARTS = {"restart": restart_overhead, "rss": rss_and_cpu, "passthrough": passthrough, "burst_nan": burst_nan,
         "latency": detection_latency, "control": control_under_flood}
# ``burst`` (the name README.md and docs/operating.md use): the nanoGPT mix of the pass-through part
# alone, and the NaN after such a burst. Not in a full run, which has them in ``passthrough`` and ``burst_nan``.
EXTRA = {"burst": lambda tmp: passthrough(tmp, MIXES[:1]) + burst_nan(tmp)}


def run(parts: list[str] | None = None) -> list[dict]:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        return [r for name in (parts or list(PARTS)) for r in {**PARTS, **EXTRA}[name](tmp)]


if __name__ == "__main__":
    for r in run(sys.argv[1:] or None):  # e.g. python bench/bench_core.py rss passthrough
        print(r)
