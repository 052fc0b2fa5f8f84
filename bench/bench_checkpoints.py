"""Checkpoint verification speed, each figure against a peer doing the same work on the same file,
in the same run:

- sha256 (``checkpoints.hash_algorithm = "sha256"``, the default) over one file: our streaming
  hash against ``openssl dgst -sha256`` (OpenSSL, with SHA extensions where the CPU has them, as
  Python's hashlib) and against coreutils ``sha256sum`` (no SHA extensions in many builds: slower);
  blake3 (not the default) beside it, against our sha256;
- the load test (a subprocess with the job's python, as the daemon runs it) against a bare
  ``python -c "torch.load(...)"`` with the same mmap setting and the same environment: at the
  defaults (``checkpoints.mmap = true``, ``check_finite = false``), with mmap off on both sides,
  and with ``check_finite = true`` against a bare load that checks every tensor too. The cost of
  the finite check is shown on its own.

- restart to first iteration after a fault, the two orders of ``checkpoints.verify``: the real
  daemon, a job that saves a torch checkpoint (``BENCH_RESTART_MB``, default 200 MB) and is killed
  right after (before the background verifier could see it settle), then resumes: it loads the
  checkpoint as nanoGPT does (``torch.load``, no mmap) and prints its first iteration. The time
  from the kill to that line, ``before-launch`` (hash + load test, then the job) against
  ``overlap`` (structural checks, the job at once, hash + load test beside its start-up); median
  of 3 per order, interleaved.

``python bench/bench_checkpoints.py [SIZE_MB]`` prints the rows (default 1024 MB; e.g. 64 for a
quick run; env BENCH_CKPT_MB works too); ``run(size_mb)`` returns them for scripts/bench.
Every contender reads a warm page cache (the file is read once before timing), so the ratios
compare the hashing or loading, not the disk. Best of 3; the loads interleave ours and the peer's.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from supervisor.checkpoints.hashing import blake3_available, file_digest
from supervisor.checkpoints.loadtest import LoadTestRequest, run_load_test

# The bare peer: the same load the load test does (weights_only, cpu), with the same mmap choice;
# with CHECK set, every tensor is checked for NaN/Inf as check_finite does.
BARE_LOAD = """\
import sys, torch
path, mmap, check = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1"
obj = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
if check:
    def walk(o):
        if isinstance(o, torch.Tensor):
            yield o
        elif isinstance(o, dict):
            for v in o.values():
                yield from walk(v)
        elif isinstance(o, (list, tuple)):
            for v in o:
                yield from walk(v)
    bad = [t for t in walk(obj) if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    assert not bad
"""


def _best_of(n: int, fn: object) -> float:
    best = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        best = min(best, time.perf_counter() - t0)
    return best


def _write_random(path: Path, size_mb: int) -> None:
    chunk = os.urandom(8 * 1024 * 1024)
    with open(path, "wb") as f:
        for _ in range(max(1, size_mb // 8)):
            f.write(chunk)


def _row(name: str, value: object, unit: str, target: object = "report") -> dict[str, object]:
    return {"name": name, "value": value, "unit": unit, "target": target}


def hashing(f: Path) -> list[dict[str, object]]:
    mb = f.stat().st_size / 1e6
    file_digest(f)  # warm the page cache for every contender
    ours = _best_of(3, lambda: file_digest(f, "sha256"))
    rows = [_row(f"sha256 of a {mb:.0f} MB file, ours (hash_algorithm = sha256, the default)",
                 round(mb / ours, 1), "MB/s")]
    peers = {"openssl": ["openssl", "dgst", "-sha256", str(f)], "sha256sum": ["sha256sum", str(f)]}
    for name, argv in peers.items():
        if not shutil.which(argv[0]):
            rows.append(_row(f"sha256, {name} (peer)", "not installed", ""))
            continue
        theirs = _best_of(3, lambda argv=argv: subprocess.run(argv, check=True, capture_output=True))
        label = " ".join(argv[:-1])
        rows.append(_row(f"sha256 of the same file, `{label}` (peer; a process start included)",
                         round(mb / theirs, 1), "MB/s", "peer"))
        rows.append(_row(f"sha256 speed ratio ours / `{label}`", round(theirs / ours, 3), "x",
                         ">= 0.9" if name == "openssl" else "report"))
    if blake3_available():
        b3 = _best_of(3, lambda: file_digest(f, "blake3"))
        rows.append(_row("blake3 of the same file, ours (hash_algorithm = blake3, not the default)",
                         round(mb / b3, 1), "MB/s"))
        rows.append(_row("blake3 speed ratio, ours blake3 / ours sha256 (a setting, not a peer)",
                         round(ours / b3, 3), "x"))
    return rows


def load_tests(d: Path, size_mb: int) -> list[dict[str, object]]:
    ck = d / "step_1.pt"
    py = sys.executable
    subprocess.run([py, "-c", "import torch,sys; n=int(sys.argv[2])*1024*1024//4; "
                    "torch.save({'model': {'w': torch.randn(n)}, 'optimizer': {}, 'step': 1}, sys.argv[1])",
                    str(ck), str(size_mb)], check=True)
    ck.read_bytes()  # warm the page cache
    # The same environment the load test gives its child (loadtest.run_load_test).
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    env.setdefault("CUDA_VISIBLE_DEVICES", "")

    def bare(mmap: bool, check: bool) -> None:
        subprocess.run([py, "-c", BARE_LOAD, str(ck), "1" if mmap else "0", "1" if check else "0"], check=True,
                       capture_output=True, env=env)

    def ours(mmap: bool, check: bool) -> None:
        r = run_load_test(LoadTestRequest(ck, expected_keys=("model",), check_finite=check, mmap=mmap),
                          python=py, timeout_s=600)
        assert r.passed, r.error

    bare(True, False)  # warm-up: torch's own files into the page cache, for both sides
    # What each reads, said in its row: with mmap on and no finite check, torch.load reads the pickle
    # and maps the storages; no tensor byte is read (a truncated or zeroed tensor region passes).
    cases = [("defaults (mmap on, finite check off: reads the pickle and the archive index, maps the tensors, "
              "reads no tensor data)", True, False, "<= 1.1"),
             ("mmap off on both sides (reads every tensor byte into memory)", False, False, "report"),
             ("check_finite = true (mmap on; reads every tensor byte and checks it is finite; the peer checks every "
              "tensor too)", True, True, "report")]
    # Best of 3, ours and the peer interleaved, so a noisy moment on this shared machine hits both.
    best: dict[tuple[str, bool, bool], float] = {}
    for _ in range(3):
        for _label, mmap, check, _t in cases:
            for who, fn in (("ours", ours), ("bare", bare)):
                t0 = time.perf_counter()
                fn(mmap, check)
                k = (who, mmap, check)
                best[k] = min(best.get(k, float("inf")), time.perf_counter() - t0)
    rows: list[dict[str, object]] = []
    for label, mmap, check, target in cases:
        o, b = best[("ours", mmap, check)], best[("bare", mmap, check)]
        rows.append(_row(f"load test of a {size_mb} MB torch checkpoint, {label}, ours", round(o, 3), "s"))
        rows.append(_row(f"bare `torch.load(mmap={mmap}, weights_only=True)`" + (" + isfinite on every tensor" if check
                         else "") + ", same file (peer)", round(b, 3), "s", "peer"))
        rows.append(_row(f"load test ratio ours / bare, {label.split(' (')[0]}", round(o / b, 3), "x", target))
    rows.append(_row("cost of check_finite = true: ours with it - ours at the defaults (mmap on)",
                     round(best[("ours", True, True)] - best[("ours", True, False)], 3), "s"))
    return rows


def warm_vs_cold(d: Path, n: int = 10, size_mb: float = 1.3) -> list[dict[str, object]]:
    """What a run with a save every few minutes pays per save: ``n`` small saves load-tested by
    the warm verifier (the default; its start and torch import included, closed at the end so its
    CPU is counted) against a process per test (``warm_verifier = false``), interleaved per round."""
    import resource

    from supervisor.checkpoints.loadtest import LoadTests

    cks = []
    for i in range(n):
        ck = d / f"warm_{i}.pt"
        subprocess.run([sys.executable, "-c", "import torch,sys; n=int(float(sys.argv[2])*1024*1024)//4; "
                        "torch.save({'model': {'w': torch.randn(n)}, 'optimizer': {}, 'iter_num': 1}, sys.argv[1])",
                        str(ck), str(size_mb)], check=True)
        cks.append(ck)

    def children_cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime

    best: dict[bool, tuple[float, float]] = {}
    for _ in range(2):
        for warm in (True, False):
            tests = LoadTests(sys.executable, expected_keys=(), check_finite=False, trust_pickles=False, mmap=True,
                              timeout_s=600, cwd=None, warm=warm)
            t0, c0 = time.perf_counter(), children_cpu()
            for ck in cks:
                assert tests.run(ck, None).passed
            tests.cancel()  # closes the warm process: its CPU is reaped and counted
            wall, cpu = (time.perf_counter() - t0) / n, (children_cpu() - c0) / n
            prev = best.get(warm)
            best[warm] = (min(wall, prev[0]), min(cpu, prev[1])) if prev else (wall, cpu)
    (ww, wc), (cw, cc) = best[True], best[False]
    return [
        _row(f"load test per save, {n} saves of {size_mb} MB, warm verifier (default; its start included; mmap on, no finite check: reads no tensor data)",
             round(ww, 3), "s"),
        _row("same, a process per test (warm_verifier = false)", round(cw, 3), "s", "peer"),
        _row("load test time per save, warm / a process per test", round(ww / cw, 3), "x", "<= 0.5"),
        _row("CPU per save (load-test processes), warm / a process per test", round(wc / cc, 3), "x", "<= 0.5"),
    ]


# Attempt 0 trains a step, saves a fresh checkpoint and is killed at once (the fault: its time in
# OUT/fault); attempt 1 loads it as nanoGPT does and prints its first iteration (time in OUT/first).
RESTART_JOB = """\
import os, sys, time
out, ck, mb = sys.argv[1], sys.argv[2], int(sys.argv[3])
import torch
frm = os.environ.get("TSUP_RESUME_FROM")
if not frm:
    print("iter 0: loss 4.0000, time 10.00ms", flush=True)
    n = mb * 1024 * 1024 // 4
    torch.save({"model": {"w": torch.randn(n)}, "optimizer": {}, "iter_num": 1}, os.path.join(ck, "tmp.pt"))
    os.replace(os.path.join(ck, "tmp.pt"), os.path.join(ck, "step_1.pt"))
    open(os.path.join(out, "fault"), "w").write(repr(time.time()))
    os.kill(os.getpid(), 9)
state = torch.load(frm, map_location="cpu", weights_only=True)
print(f"iter {state['iter_num'] + 1}: loss 3.9000, time 10.00ms", flush=True)
open(os.path.join(out, "first"), "w").write(repr(time.time()))
"""


def restart_once(d: Path, verify: str, size_mb: int) -> float:
    """Seconds from the kill of a job that had just saved ``size_mb`` to its next attempt's first
    iteration, under the real daemon with ``checkpoints.verify = verify``."""
    d.mkdir(parents=True)
    ck, out, sd = d / "ck", d / "out", d / "sd"
    ck.mkdir()
    out.mkdir()
    cfg = d / "c.toml"
    cfg.write_text(f'[checkpoints]\nverify = "{verify}"\n')
    cp = subprocess.run([sys.executable, "-m", "supervisor", "wrap", "--state-dir", str(sd), "--config", str(cfg),
                         "--checkpoint-dir", str(ck), "--backoff", "0", "--max-restarts", "2", "--",
                         sys.executable, "-c", RESTART_JOB, str(out), str(ck), str(size_mb)],
                        cwd=str(Path(__file__).resolve().parent.parent), capture_output=True, timeout=600)
    if cp.returncode != 0:
        raise RuntimeError(f"verify={verify}: the daemon exited {cp.returncode}: {cp.stderr.decode()[-2000:]}")
    return float((out / "first").read_text()) - float((out / "fault").read_text())


def verify_order(d: Path, size_mb: int | None = None, rounds: int = 3) -> list[dict[str, object]]:
    size_mb = size_mb or int(os.environ.get("BENCH_RESTART_MB", "200"))
    times: dict[str, list[float]] = {"before-launch": [], "overlap": []}
    for i in range(rounds):
        for verify in times:  # interleaved, so a noisy moment hits both orders
            times[verify].append(restart_once(d / f"{verify}-{i}", verify, size_mb))
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    return [
        _row(f"kill to first iteration, fresh {size_mb} MB checkpoint, checkpoints.verify = before-launch "
             "(hash + load test, then the job; --backoff 0 --max-restarts 2, not the defaults: relaunched at once)",
             round(med["before-launch"], 3), "s"),
        _row("kill to first iteration, same, checkpoints.verify = overlap (structural checks, the job at once, "
             "load test beside its start-up; the default)", round(med["overlap"], 3), "s"),
        _row("restart saved by overlap: before-launch - overlap", round(med["before-launch"] - med["overlap"], 3),
             "s", "> 0"),
    ]


def cli_list(d: Path, n: int = 12) -> list[dict[str, object]]:
    """``transformer-supervisor checkpoints`` on ``n`` small checkpoints of a finished run (a
    ledger that recorded the command, manifests with config snapshots): the whole verb, its
    interpreter start and one warm load-test process included; and with ``--no-load-test``."""
    from supervisor.client import save_checkpoint
    from supervisor.config.model import load_config
    from supervisor.job.launch import config_json
    from supervisor.ledger.store import Ledger

    ck, sd = d / "ck", d / "state"
    ck.mkdir(parents=True)
    sd.mkdir()
    import torch

    for i in range(n):
        step = (i + 1) * 100
        save_checkpoint({"model": {"w": torch.randn(2048)}, "iter_num": step}, ck / f"step_{step:06d}.pt",
                        step=step, config={"lr": 3e-4})
    old = time.time() - 60
    for p in ck.iterdir():
        os.utime(p, (old, old))
    toml = d / "c.toml"
    toml.write_text(f'[job]\ncommand = ["{sys.executable}", "train.py", "--lr", "3e-4"]\nworkdir = "{d}"\n'
                    f'[state]\ndir = "{sd}"\n[checkpoints]\ndir = "{ck}"\n')
    led = Ledger(sd)
    run_id, _ = led.open_run("bench", config_json(load_config(str(toml))))
    led.end_run(run_id, "finished", 0, "the job exited 0")
    led.close()
    argv = [sys.executable, "-m", "supervisor", "checkpoints", "--checkpoint-dir", str(ck), "--state-dir", str(sd)]
    root = str(Path(__file__).resolve().parent.parent)

    def once(extra: list[str]) -> float:
        t0 = time.perf_counter()
        subprocess.run(argv + extra, cwd=root, check=True, capture_output=True)
        return time.perf_counter() - t0

    full = _best_of(2, lambda: once([]))
    quick = _best_of(2, lambda: once(["--no-load-test"]))
    return [_row(f"`checkpoints` on {n} small checkpoints of a finished run (state dir, load tests)", round(full, 3),
                 "s", "< 10"),
            _row("same, `--no-load-test`", round(quick, 3), "s")]


def run(size_mb: int | None = None) -> list[dict[str, object]]:
    size_mb = size_mb or int(os.environ.get("BENCH_CKPT_MB", "1024"))
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as d:
        f = Path(d) / "blob.bin"
        _write_random(f, size_mb)
        rows = hashing(f)
        f.unlink()
        rows += load_tests(Path(d), size_mb)
        rows += warm_vs_cold(Path(d))
        rows += verify_order(Path(d) / "restart")
        rows += cli_list(Path(d) / "cli")
    return rows


if __name__ == "__main__":
    for row in run(int(sys.argv[1]) if len(sys.argv) > 1 else None):
        print(row)
