"""Daemon-side CPU cost of the GPU monitor at its defaults (``gpu.poll_s = 1``, events on): 8 fake
devices polled every second for ~10 s (BENCH_HEALTH_SECONDS). The fake backend is constructed here
and handed to the monitor (tests and benchmarks inject it; nothing in production selects it).

Our overhead only: the fake backend's own cost (its queries, timed in isolation and multiplied by
the number of queries the monitor made) is subtracted from the process CPU time. The monitor runs
as in the daemon: a poll thread and an event thread (blocked in ``wait_events``).

``python bench/bench_health.py`` prints the rows; ``run()`` returns them for scripts/bench.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from supervisor.health.config import GpuConfig
from supervisor.health.gpufake import FakeBackend
from supervisor.health.gpumonitor import GpuMonitor

DEVICES = 8
SECONDS = float(os.environ.get("BENCH_HEALTH_SECONDS", "10"))


def _fake_query_cost(fake: FakeBackend, n: int = 2000) -> float:
    """CPU seconds per fake query, measured with nothing of ours around it."""
    t0 = time.process_time()
    for k in range(n):
        fake.memory(k % DEVICES)
    return (time.process_time() - t0) / n


def run() -> list[dict[str, object]]:
    fake = FakeBackend(DEVICES, total_gb=80, timeline=[
        (0, {"memory": {"device": i, "used_frac": 0.4 + 0.05 * i}}) for i in range(DEVICES)] + [
        (0, {"processes": {"device": i, "pids": {"job": 10 * 1024**3}}}) for i in range(DEVICES)])
    mon = GpuMonitor(fake, GpuConfig())  # the defaults: poll_s = 1 s, events on
    detections: list[object] = []
    mon.start(None, detections.append)
    calls0, cpu0, wall0 = fake.calls, time.process_time(), time.monotonic()
    time.sleep(SECONDS)  # the benchmark itself: the main thread idles while the monitor works
    cpu, wall, calls = time.process_time() - cpu0, time.monotonic() - wall0, fake.calls - calls0
    polls = mon.polls
    mon.stop()
    fake_cpu = calls * _fake_query_cost(fake)
    ours = max(cpu - fake_cpu, 0.0)
    how = f"{DEVICES} scripted fake devices (no NVML, no GPU), gpu.poll_s = 1 s and events on (the defaults), {SECONDS:g} s"
    return [
        {"name": f"GPU monitor CPU, daemon side, {how} (the fake's own cost subtracted)",
         "value": round(100 * ours / wall, 3), "unit": "% of a core", "target": "< 1"},
        {"name": "GPU monitor CPU per poll of every device, same run (fake devices, the fake's own cost "
                 "subtracted: NVML's query time on a real GPU is not in this figure)", "value": round(1000 * ours / max(polls, 1), 3),
         "unit": "ms", "target": "< 10"},
        {"name": "GPU monitor polls made in the run", "value": polls, "unit": "polls",
         "target": f">= {int(SECONDS) - 1}"},
        {"name": "the fake backend's own CPU, subtracted above (its queries timed alone)",
         "value": round(1000 * fake_cpu, 3), "unit": "ms", "target": "-"},
    ]

if __name__ == "__main__":
    for row in run():
        print(f"{row['name']:45s} {row['value']:>10} {row['unit']:6s} target {row['target']}")
