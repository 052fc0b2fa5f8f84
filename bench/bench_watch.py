"""Watch figures, each against a peer or target measured in the same run.

- ingestion: typical training output (mostly non-metric lines, a metric line every 5 lines) fed to
  the LogWatcher with every detector on, lines/s, vs plain line splitting of the same bytes (the
  ``hf5`` row's metric line is a transformers 5.x Trainer dict from ``tests/corpus/``). Measured
  in CPU seconds of this process (the watcher is one CPU-bound thread; on a shared machine the
  wall clock mostly measures the neighbours);
- worst crafted line per format: the costliest crafted 4 kB line of each format (tests/watch/crafted.py),
  parser plus every text rule, per line;
- ``heartbeat()`` cost per call in a tight loop, supervised (writes every 1 s) and unsupervised;
- detection latency, line -> Detection, p50/p99 over 300 trials: (a) in the LogWatcher from
  ``feed`` to ``emit``; (b) from a line appended to a watched file to ``emit`` through the
  FileTailer (inotify). End-to-end (job pipe -> decision logged) is measured by the integrator;
- hang detection delay beyond the configured heartbeat timeout, main-loop tick 0.1 s.

``python bench/bench_watch.py`` prints the rows; ``run()`` returns them for scripts/bench.
"""
from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from supervisor.events import AttemptContext  # noqa: E402
from supervisor.core.observations import Detection  # noqa: E402
from supervisor.watch.config import DetectorsConfig, HeartbeatConfig  # noqa: E402
from supervisor.watch.heartbeat import HeartbeatMonitor  # noqa: E402
from supervisor.watch.logwatch import LogWatcher  # noqa: E402
from supervisor.watch.tail import FileTailer  # noqa: E402

NOISE = [
    "[2025-01-01 12:00:00,123] INFO data: loaded shard 17 of 128 (batch_size=32, seq_len=2048)",
    '  warnings.warn("torch.utils.checkpoint: the use_reentrant parameter should be passed explicitly")',
    "Epoch 3: 45%|#####     | 4500/10000 [12:34<15:20, 5.97it/s]",
    "[2025-01-01 12:00:01,456] INFO trainer: tokens processed 123456789, throughput ok, eta 3:12:00",
    "[2025-01-01 12:00:02,789] DEBUG dataloader: worker 3 prefetched 8 batches",
    "NCCL INFO Channel 00/02 :    0   1   2   3   4   5   6   7",
]


CORPUS = ROOT / "tests" / "corpus"
_HF5_TEMPLATE: list[str] = []


def _hf5_line(loss: float) -> str:
    """A real transformers 5.x train dict (tests/corpus/hf5_filter_on.stdout) with its loss replaced."""
    if not _HF5_TEMPLATE:
        _HF5_TEMPLATE.append(next(ln for ln in (CORPUS / "hf5_filter_on.stdout").read_text().splitlines()
                                  if ln.startswith("{'loss': '") and "nan" not in ln))
    t = _HF5_TEMPLATE[0]
    i = t.index("'loss': '") + 9
    return t[:i] + f"{loss:.4g}" + t[t.index("'", i):]


def metric_line(fmt: str, step: int, loss: float) -> str:
    if fmt == "hf5":
        return _hf5_line(loss)
    if fmt == "nanogpt":
        return f"iter {step}: loss {loss:.4f}, time 12.34ms, mfu 1.20%"
    if fmt == "json":
        return f'{{"step": {step}, "loss": {loss:.4f}, "grad_norm": 1.05, "lr": 0.0003, "tokens_per_sec": 120000}}'
    if fmt == "megatron":
        return (f" iteration {step:8d}/  500000 | consumed samples: {step * 512:12d} | elapsed time per iteration "
                f"(ms): 1234.5 | learning rate: 1.500E-04 | global batch size:   512 | lm loss: {loss:.6E} | "
                "loss scale: 1.0 | grad norm: 2.103 | number of skipped iterations:   0 | number of nan iterations:   0 |")
    if fmt == "generic":  # a hand-written loop's logging line (tests/trainer_scripts/loop_logging_train.py)
        return f"2026-12-03 21:06:25,513 INFO trainer: epoch 0 | iter {step}/300000 | train_loss={loss:.4f} | lr=0.05"
    raise ValueError(fmt)


def stream(n: int, every: int, fmt: str) -> list[str]:
    out = []
    step = 0
    for i in range(n):
        if i % every == 0:
            step += 1
            out.append(metric_line(fmt, step, 2.5 + (step % 7) * 0.01))
        else:
            out.append(NOISE[i % len(NOISE)])
    return out


def ingestion(n: int = 300_000, batch: int = 256) -> list[dict]:
    rows = []
    for fmt, every in (("nanogpt", 5), ("json", 5), ("megatron", 5), ("hf5", 5), ("generic", 5), ("nanogpt", 20)):
        lines = stream(n, every, fmt)
        batches = [lines[i:i + batch] for i in range(0, n, batch)]
        best = 0.0
        for _ in range(3):
            got: list[object] = []
            dets: list[Detection] = []
            w = LogWatcher(DetectorsConfig(), dets.append, got.append)
            t0 = time.process_time()
            for b in batches:
                w.feed("stdout", b)
            dt = time.process_time() - t0
            assert not dets and len(got) == n // every, (fmt, len(got), dets[:1])
            best = max(best, n / dt)
        text = [("\n".join(b) + "\n").encode() for b in batches]
        plain = 0.0
        for _ in range(3):
            t0 = time.process_time()
            count = 0
            for chunk in text:
                count += len(chunk.decode().splitlines())
            plain = max(plain, count / max(1e-9, time.process_time() - t0))
        rows.append({"name": f"parsers alone, in-process (LogWatcher.feed, not end to end: see core pass-through), all "
                             f"detectors on, {fmt} metric line every {every} lines (CPU time, best of 3)",
                     "value": round(best), "unit": "lines/s", "target": ">= 300000"})
        rows.append({"name": f"the same {fmt} bytes, plain decode + splitlines (the least any reader of them does; "
                             "CPU time, best of 3) (peer)", "value": round(plain), "unit": "lines/s", "target": "peer"})
    return rows


def heartbeat_cost(calls: int = 2_000_000) -> list[dict]:
    """Per call: the amortised cost at the default interval (a write at most every 1 s, so nearly
    every call only compares the clock), the cost of a call that writes (interval 0: every call
    rewrites the record with one pwrite), and the no-op outside supervision."""
    rows = []
    with tempfile.TemporaryDirectory() as d:
        sup = {"TSUP_RUN_ID": "bench", "TSUP_HEARTBEAT_DIR": d}
        for label, env, n, target in (
                ("supervised at the default interval (writes at most every 1 s): amortised over calls that "
                 "mostly only read the clock", sup, calls, "<= 1000"),
                ("supervised, a call that writes (TSUP_HEARTBEAT_INTERVAL_S = 0, not the default: every call "
                 "rewrites the record, one pwrite of a fixed-size JSON)", {**sup, "TSUP_HEARTBEAT_INTERVAL_S": "0"},
                 calls // 20, "report"),
                ("outside supervision (no-op)", {}, calls, "<= 1000")):
            saved = {k: os.environ.get(k) for k in ("TSUP_RUN_ID", "TSUP_HEARTBEAT_DIR", "TSUP_HEARTBEAT_INTERVAL_S")}
            for k in saved:
                os.environ.pop(k, None)
            os.environ.update(env)
            from supervisor.client import _heartbeat
            _heartbeat._reset_for_tests()
            hb = _heartbeat.heartbeat
            try:
                best = float("inf")
                for _ in range(3):
                    t0 = time.perf_counter()
                    for i in range(n):
                        hb(i)
                    best = min(best, (time.perf_counter() - t0) / n)
            finally:
                _heartbeat._reset_for_tests()
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
            rows.append({"name": f"heartbeat(step) per call, {label} (best of 3 x {n:,} calls)",
                         "value": round(best * 1e9), "unit": "ns", "target": target})
    return rows


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def latency_logwatcher(trials: int = 300) -> list[dict]:
    hit = threading.Event()
    stamp: list[int] = []

    def emit(d: Detection) -> None:
        stamp.append(time.perf_counter_ns())
        hit.set()

    w = LogWatcher(DetectorsConfig(), emit, lambda r: None)
    noise = stream(255, 5, "nanogpt")
    lat = []
    for i in range(trials):
        w.reset(i, None)
        stamp.clear()
        batch = noise + [f"iter {1000 + i}: loss nan, time 12.34ms, mfu 1.20%"]
        t0 = time.perf_counter_ns()
        w.feed("stdout", batch)
        assert stamp, "no detection"
        lat.append((stamp[0] - t0) / 1e6)
    return [{"name": "detection latency, LogWatcher feed(256-line batch) -> emit, p50", "value": round(_pct(lat, .5), 3),
             "unit": "ms", "target": "report (the target is on the p99 below)"},
            {"name": "detection latency, LogWatcher feed(256-line batch) -> emit, p99", "value": round(_pct(lat, .99), 3),
             "unit": "ms", "target": "<= 50"}]


def latency_file(trials: int = 300) -> list[dict]:
    got: list[int] = []
    ev = threading.Event()

    def emit(d: Detection) -> None:
        got.append(time.perf_counter_ns())
        ev.set()

    w = LogWatcher(DetectorsConfig(), emit, lambda r: None)
    lat = []
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "rank0.log"
        path.write_text("")
        t = FileTailer([str(path)], Path(d), w, poll_interval_s=0.5)
        t.start()
        try:
            with open(path, "a", buffering=1) as f:
                for i in range(trials):
                    w.reset(i, None)
                    ev.clear()
                    got.clear()
                    f.write(NOISE[i % len(NOISE)] + "\n")
                    t0 = time.perf_counter_ns()
                    f.write(f"iter {i}: loss nan, time 12.34ms, mfu 1.20%\n")
                    if not ev.wait(5):
                        raise RuntimeError("no detection within 5 s")
                    lat.append((got[0] - t0) / 1e6)
        finally:
            t.close()
    mode = "inotify" if t.status()["inotify_error"] is None else "poll"
    return [{"name": f"detection latency, line appended to a watched file -> emit ({mode}), p50",
             "value": round(_pct(lat, .5), 3), "unit": "ms", "target": "report (the target is on the p99 below)"},
            {"name": f"detection latency, line appended to a watched file -> emit ({mode}), p99",
             "value": round(_pct(lat, .99), 3), "unit": "ms", "target": "<= 50"}]


def hang_delay(trials: int = 10, timeout_s: float = 0.5, tick: float = 0.1) -> list[dict]:
    delays = []
    with tempfile.TemporaryDirectory() as d:
        hb = Path(d)
        m = HeartbeatMonitor(HeartbeatConfig(timeout_s=timeout_s))
        for i in range(trials):
            out: list[Detection] = []
            ctx = AttemptContext(run_id="b", attempt=i, pgid=0, pid=0, started_monotonic=time.monotonic(),
                                 state_dir=hb, heartbeat_dir=hb, checkpoint_dir=None, resume_from=None,
                                 resume_step=None)
            m.start(ctx, out.append)
            last = time.time()
            (hb / "heartbeat-rank0.json").write_text(
                f'{{"v":1,"rank":0,"pid":1,"attempt":{i},"step":1,"state":"running","t":{last},"seq":1}}')
            while not out:
                m.poll(time.monotonic())
                time.sleep(tick)  # the runner's main-loop tick
            delays.append(time.time() - last - timeout_s)
            m.stop()
    return [{"name": f"hang detection delay beyond the timeout ({timeout_s} s timeout, {tick} s tick), max of {trials}",
             "value": round(max(delays), 3), "unit": "s", "target": "<= 1"}]


def crafted_lines(calls: int = 200) -> list[dict]:
    """Per line format, the worst of its crafted 4 kB lines (tests/watch/crafted.py: inputs that make a
    backtracking regex work hardest): the parser plus every built-in text rule, best of 3 per line."""
    from supervisor.watch.parsers import MetricParser
    from tests.watch.crafted import CRAFTED, parse_all

    rows = []
    parser = MetricParser()
    for fmt, builds in CRAFTED.items():
        worst = 0.0
        for build in builds:
            line = build(4096)
            best = float("inf")
            for _ in range(3):
                t0 = time.process_time()
                for _ in range(calls):
                    parse_all(parser, line)
                best = min(best, (time.process_time() - t0) / calls)
            worst = max(worst, best)
        rows.append({"id": f"watch-crafted-{fmt.replace(' ', '-')}", "name": f"worst crafted line per format: {fmt}, 4 kB line, parser + text rules (CPU time)",
                     "value": round(worst * 1e6), "unit": "us/line", "target": "<= 5000 (was 1.45 s: torchtitan)"})
    return rows


def run() -> list[dict]:
    return ingestion() + crafted_lines() + heartbeat_cost() + latency_logwatcher() + latency_file() + hang_delay()


if __name__ == "__main__":
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    for r in run():
        print(r)
