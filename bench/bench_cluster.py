"""Multi-node coordination: three real daemons (one per simulated node, each with its own state
and checkpoint dir) and a real etcd on loopback (Debian's etcd-server, installed on demand), the
test suite's tiny job (tests/cluster/cluster_job.py: a step every 50 ms, a checkpoint every 10).

Per trial, node n2's job prints a NaN at step 35 of generation 1. Figures, from the jobs' own
records (wall clock, one machine):

- detection -> every node stopped: the NaN line's print -> the last of the three jobs to receive
  its stop signal (the NaN node stops its own job; the others are told through etcd);
- detection -> every node relaunched: the same NaN -> the last of the three generation-2 jobs to
  start (the stops, the checkpoint agreement, the leader's plan, three launches);
- the daemon's peak RSS with the cluster client (psutil, every 50 ms, node n1's daemon), and the
  same job and NaN under one daemon without [cluster] as its baseline.

Settings: cluster.lease_ttl_s = 3, shutdown.grace_s = 5, backoff 0, validation off (the relaunch
is what is timed, not the policy's backoff). BENCH_CLUSTER_TRIALS (3).
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import threading
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TRIALS = int(os.environ.get("BENCH_CLUSTER_TRIALS", "3"))
NODES = ("n1", "n2", "n3")


def _read_jsonl(p: Path) -> list[dict]:
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []


def _peak_rss(pid: int, stop: threading.Event, out: list[float]) -> None:
    import psutil

    try:
        proc = psutil.Process(pid)
        while not stop.is_set():
            out.append(proc.memory_info().rss / 2**20)
            stop.wait(0.05)
    except psutil.Error:
        return


def trial(tmp: Path) -> tuple[float, float, float]:
    from tests.cluster.daemons import node_config, start
    from tests.cluster.etcdserver import EtcdServer

    etcd = EtcdServer(tmp / "etcd")
    etcd.start()
    prefix = f"/bench/{uuid.uuid4().hex[:8]}"
    ds = {}
    rss: list[float] = []
    stop = threading.Event()
    try:
        for n in NODES:
            cfg = node_config(tmp, n, etcd, prefix, nodes=3, lease_ttl_s=3.0,
                              job_args=["60", "0.05", "10", "n2", "35"])
            ds[n] = start(tmp, n, cfg)
        sampler = threading.Thread(target=_peak_rss, args=(ds["n1"].proc.pid, stop, rss), daemon=True)
        sampler.start()
        for n, d in ds.items():
            code = d.wait(180)
            if code != 0:
                raise RuntimeError(f"{n} exited {code}: {d.stderr()[-500:]}")
    finally:
        stop.set()
        for d in ds.values():
            if d.proc.poll() is None:
                d.kill()
        etcd.stop()
    nan_at = float((tmp / "n2" / "out" / "nan_at").read_text())
    stopped = max(s["at"] for n in NODES for s in _read_jsonl(tmp / n / "out" / "stops.jsonl") if s["gen"] == 1)
    relaunched = max(x["at"] for n in NODES for x in _read_jsonl(tmp / n / "out" / "launches.jsonl")
                     if x.get("TSUP_GENERATION") == "2")
    return stopped - nan_at, relaunched - nan_at, max(rss) if rss else float("nan")


def single_node_peak(tmp: Path) -> float:
    """The same job and NaN under one daemon without [cluster]: the RSS baseline."""
    from tests.cluster.daemons import node_config
    from tests.cluster.etcdserver import EtcdServer
    from tests.conftest import Daemon

    etcd = EtcdServer(tmp / "etcd")  # only to render the config; not started
    cfg = node_config(tmp, "n1", etcd, "/unused", nodes=1, job_args=["60", "0.05", "10", "n1", "35"])
    cfg.write_text(cfg.read_text().split("[cluster]")[0].replace("[state]", 'env = { TSUP_NODE_ID = "n1" }\n[state]'))
    (tmp / "d").mkdir()
    d = Daemon(["run", "--config", str(cfg)], tmp / "d")
    rss: list[float] = []
    stop = threading.Event()
    sampler = threading.Thread(target=_peak_rss, args=(d.proc.pid, stop, rss), daemon=True)
    sampler.start()
    try:
        d.wait(180)
    finally:
        stop.set()
        if d.proc.poll() is None:
            d.kill()
    return max(rss) if rss else float("nan")


def run() -> list[dict[str, object]]:
    stops, relaunches, peaks = [], [], []
    for _ in range(TRIALS):
        with tempfile.TemporaryDirectory(prefix="bench-cluster-") as d:
            s, r, m = trial(Path(d))
        stops.append(s)
        relaunches.append(r)
        peaks.append(m)
    with tempfile.TemporaryDirectory(prefix="bench-cluster-single-") as d:
        single = single_node_peak(Path(d))
    how = f"3 daemons + real etcd on one machine, NaN on one node, {TRIALS} trials"
    return [
        {"name": f"detection on one node -> every node's job stopped, median ({how})",
         "value": round(statistics.median(stops), 2), "unit": "s", "target": "report"},
        {"name": "detection on one node -> every node's job stopped, worst trial",
         "value": round(max(stops), 2), "unit": "s", "target": "report"},
        {"name": "detection on one node -> every node relaunched in the next generation, median",
         "value": round(statistics.median(relaunches), 2), "unit": "s", "target": "report"},
        {"name": "detection on one node -> every node relaunched in the next generation, worst trial",
         "value": round(max(relaunches), 2), "unit": "s", "target": "report"},
        {"name": "daemon peak RSS with [cluster] (etcd client, agent thread; its own pid, with a checkpoint dir)",
         "value": round(max(peaks), 1), "unit": "MiB", "target": "<= 55"},
        {"name": "the same job and NaN under one daemon without [cluster] (the baseline of the row above)",
         "value": round(single, 1), "unit": "MiB", "target": "<= 55"},
    ]


if __name__ == "__main__":
    for row in run():
        print(f"{row['name']:90s} {row['value']:>8} {row['unit']:4s} target {row['target']}")
