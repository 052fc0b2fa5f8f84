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

Scale (issue 26): N real node agents (:class:`ClusterAgent`, each with its own etcd client, watch
and lease: what a daemon runs for [cluster]) spread over BENCH_CLUSTER_PROCS worker processes
(default: the CPU count; bench/cluster_scale_worker.py, node i in worker i mod P; 1: threads of this
process, the old mode), with stand-in jobs (a thread per node that "runs" between its join and its
stop), against one real etcd, for each N in
BENCH_CLUSTER_SCALE (16,64,256; empty: none). One NaN on one node; figures: detection -> every
node stopped, -> every node relaunched (and relaunched after the slowest stop), etcd requests a
second at rest and per fault (counted by the clients), CPU at rest of the N agents (summed over
their processes) and of etcd. The agents' default turn (0.2 s) and a lease TTL of 10 s (the default). ``python
bench/bench_cluster.py scale 16 64`` runs only these rows; ``poll`` after the sizes adds the same
with the watch off (every agent reads every key each turn: the old way) for comparison.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
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


class _Counting:
    """Counts every request an :class:`EtcdClient` sends (one tally for all agents)."""

    def __init__(self) -> None:
        self.n = 0
        self.lock = threading.Lock()

    def client(self, endpoint: str):
        from supervisor.cluster.etcd import EtcdClient

        tally = self

        class Client(EtcdClient):
            def _post(self, path, body):
                with tally.lock:
                    tally.n += 1
                return super()._post(path, body)

            def stream(self, path, body, idle_s):
                with tally.lock:
                    tally.n += 1
                return super().stream(path, body, idle_s)

        return Client([endpoint], timeout_s=5.0)


def _cpu_s(pid: int | None = None) -> float:
    """CPU seconds (user + system) of this process, or of ``pid`` (from /proc: no psutil needed)."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


PROCS = max(1, int(os.environ.get("BENCH_CLUSTER_PROCS", "0") or 0) or (os.cpu_count() or 1))


def _all_joined(launches: dict[int, dict[str, float]], n: int, timeout: float = 300.0) -> float:
    """When the last of the ``n`` nodes launched generation 1 (wall clock); raises past ``timeout``."""
    deadline = time.time() + timeout
    while len(launches[1]) < n and time.time() < deadline:
        time.sleep(0.05)
    if len(launches[1]) < n:
        raise RuntimeError(f"only {len(launches[1])} of {n} nodes joined generation 1")
    return max(launches[1].values())


def scale_trial(tmp: Path, n: int, watch: bool = True, rest_s: float = 10.0, procs: int = PROCS) -> dict[str, float]:
    """One scale trial: the N agents in ``procs`` worker processes (1: threads of this process)."""
    if procs > 1:
        return _scale_trial_procs(tmp, n, watch, rest_s, min(procs, n))
    return _scale_trial_one(tmp, n, watch, rest_s)


class _Worker:
    """A cluster_scale_worker.py process with its share of the agents; its reports land in the
    trial's shared dicts (launches, stops) or, for replies to a command, in its queue."""

    def __init__(self, spec: dict[str, object], launches: dict[int, dict[str, float]], stops: dict[str, float],
                 lock: threading.Lock) -> None:
        import queue
        import subprocess

        self.replies: queue.Queue[dict[str, object]] = queue.Queue()
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("cluster_scale_worker.py")),
                                      json.dumps(spec)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._launches, self._stops, self._lock = launches, stops, lock
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            msg = json.loads(line)
            if "launch" in msg:
                with self._lock:
                    self._launches[int(msg["launch"])][str(msg["node"])] = float(msg["t"])
            elif "stop" in msg:
                with self._lock:
                    self._stops.setdefault(str(msg["stop"]), float(msg["t"]))
            else:
                self.replies.put(msg)

    def send(self, cmd: str, **kw: object) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"cmd": cmd, **kw}) + "\n")
        self.proc.stdin.flush()

    def ask(self, cmd: str, key: str, timeout_s: float = 120.0) -> object:
        self.send(cmd)
        while True:
            msg = self.replies.get(timeout=timeout_s)
            if key in msg:
                return msg[key]

    def close(self) -> dict[str, int]:
        events: dict[str, int] = {}
        try:
            if self.proc.poll() is None:
                self.send("quit")
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            deadline = time.time() + 60
            while time.time() < deadline:  # its last word, the agents' events, comes after the closes
                try:
                    msg = self.replies.get(timeout=0.2)
                except Exception:  # queue.Empty: not yet
                    continue
                if "events" in msg:
                    events = msg["events"]  # type: ignore[assignment]
                    break
        except (BrokenPipeError, OSError):
            pass  # it ended already
        try:
            self.proc.wait(30)
        except Exception:  # subprocess.TimeoutExpired: it does not close; it goes
            self.proc.kill()
            self.proc.wait()
        return events


def _scale_trial_procs(tmp: Path, n: int, watch: bool, rest_s: float, procs: int) -> dict[str, float]:
    """The same trial as :func:`_scale_trial_one`, the agents spread over ``procs`` processes
    (node i in worker i mod procs), as real nodes each have their own CPU."""
    from tests.cluster.etcdserver import EtcdServer

    etcd = EtcdServer(tmp / "etcd")
    etcd.start()
    prefix = f"/bench/{uuid.uuid4().hex[:8]}"
    launches: dict[int, dict[str, float]] = {1: {}, 2: {}}
    stops: dict[str, float] = {}
    lock = threading.Lock()
    nodes = [f"n{i}" for i in range(n)]
    workers: list[_Worker] = []
    events: Counter[str] = Counter()

    def sample() -> tuple[float, int]:
        got = [w.ask("sample", "sample") for w in workers]
        assert all(isinstance(g, dict) for g in got), got
        return (sum(float(g["cpu"]) for g in got if isinstance(g, dict)),
                sum(int(g["requests"]) for g in got if isinstance(g, dict)))

    try:
        for p in range(procs):
            spec = {"n": n, "prefix": prefix, "endpoint": etcd.endpoint, "watch": watch, "nodes": nodes[p::procs]}
            workers.append(_Worker(spec, launches, stops, lock))
        for w in workers:
            w.replies.get(timeout=120)  # {"ready": true}: agents built, nothing sent yet
        t_start = time.time()
        for w in workers:
            w.send("go")
        first_gen = _all_joined(launches, n) - t_start
        time.sleep(3.0)  # the joins' records settle
        epid = etcd.proc.pid  # type: ignore[union-attr]
        (c0, r0), e0, t0 = sample(), _cpu_s(epid), time.time()
        time.sleep(rest_s)
        (c1, r1), e1, t1 = sample(), _cpu_s(epid), time.time()
        rest_cpu, etcd_cpu = (c1 - c0) / (t1 - t0), (e1 - e0) / (t1 - t0)
        rest_rps = (r1 - r0) / (t1 - t0)
        victim = n // 2
        r_fault = sample()[1]
        nan_at = time.time()
        with lock:
            stops[nodes[victim]] = nan_at  # the daemon stops its own job
        workers[victim % procs].send("nan", node=nodes[victim])
        deadline = time.time() + 300
        while len(launches[2]) < n and time.time() < deadline:
            time.sleep(0.05)
        if len(launches[2]) < n:
            raise RuntimeError(f"only {len(launches[2])} of {n} nodes relaunched")
        done = max(launches[2].values())
        settle = time.time() + 60  # the records that say "running" again are part of the fault's cost
        while time.time() < settle and not all(w.ask("settled", "settled") for w in workers):
            time.sleep(0.05)
        fault_requests = sample()[1] - r_fault
        print(f"{nan_at:.3f} NaN on {nodes[victim]}; {time.time():.3f} settled, the workers close", file=sys.stderr)
        return {"first_gen": first_gen, "stopped": max(stops.values()) - nan_at, "relaunched": done - nan_at,
                "after_slowest_stop": done - max(stops.values()), "rest_rps": rest_rps, "fault_requests":
                fault_requests, "rest_cpu": rest_cpu, "etcd_cpu": etcd_cpu}
    finally:
        for w in workers:
            events.update(w.close())
        print(f"N={n} in {procs} processes: agents' events {dict(events)}", file=sys.stderr)
        etcd.stop()


def _scale_trial_one(tmp: Path, n: int, watch: bool = True, rest_s: float = 10.0) -> dict[str, float]:
    from supervisor.cluster.agent import ClusterAgent
    from supervisor.cluster.coord import Rules
    from supervisor.cluster.runkeys import Keys
    from tests.cluster.etcdserver import EtcdServer

    etcd = EtcdServer(tmp / "etcd")
    etcd.start()
    count = _Counting()
    rules = Rules(nodes=n, min_nodes=n, wait_for_nodes_s=60.0, lease_ttl_s=10.0)
    keys = Keys(f"/bench/{uuid.uuid4().hex[:8]}")
    launches: dict[int, dict[str, float]] = {1: {}, 2: {}}
    stops: dict[str, float] = {}
    stopped = {f"n{i}": threading.Event() for i in range(n)}
    lock = threading.Lock()
    agents: dict[str, ClusterAgent] = {}
    events: Counter[str] = Counter()  # what the agents said (lost leases, ignored keys): printed, not a row

    def note(event: str, _level: str, _msg: str, _data: object) -> None:
        with lock:
            events[event] += 1

    def on_stop(node: str):
        def stop(_req: object) -> None:  # the stand-in job stops at once
            with lock:
                stops.setdefault(node, time.time())
            stopped[node].set()
        return stop

    def job(node: str) -> None:  # the daemon's launch loop, with a job that runs until stopped
        a = agents[node]
        for gen in (1, 2):
            plan = a.wait_for_generation([10, 20] if gen == 2 else [])
            with lock:
                launches[plan.gen][node] = time.time()
            if gen == 1:
                stopped[node].wait(600)

    try:
        for i in range(n):
            node = f"n{i}"
            agents[node] = ClusterAgent(count.client(etcd.endpoint), keys, node, "127.0.0.1", rules,
                                        on_stop=on_stop(node), on_event=note, watch=watch)
        t_start = time.time()
        for a in agents.values():
            a.start()
        jobs = [threading.Thread(target=job, args=(node,), daemon=True) for node in agents]
        for t in jobs:
            t.start()
        first_gen = _all_joined(launches, n) - t_start
        time.sleep(3.0)  # the joins' records settle
        epid = etcd.proc.pid  # type: ignore[union-attr]
        c0, e0, r0, t0 = _cpu_s(), _cpu_s(epid), count.n, time.time()
        time.sleep(rest_s)
        c1, e1, r1, t1 = _cpu_s(), _cpu_s(epid), count.n, time.time()
        rest_cpu, etcd_cpu = (c1 - c0) / (t1 - t0), (e1 - e0) / (t1 - t0)
        rest_rps = (r1 - r0) / (t1 - t0)
        victim = f"n{n // 2}"
        r_fault = count.n
        nan_at = time.time()
        with lock:
            stops[victim] = nan_at  # the daemon stops its own job
        agents[victim].request_end("nan", "loss is nan at step 25", 25, 25, "rollback")
        stopped[victim].set()
        for t in jobs:
            t.join(300)
        if len(launches[2]) < n:
            raise RuntimeError(f"only {len(launches[2])} of {n} nodes relaunched")
        done = max(launches[2].values())
        settle = time.time() + 60  # the records that say "running" again are part of the fault's cost
        while time.time() < settle and not all(a._published is not None and a._published.gen == 2
                                                and a._published.phase.value == "running" for a in agents.values()):
            time.sleep(0.05)
        fault_requests = count.n - r_fault
        print(f"N={n}: agents' events {dict(events)}", file=sys.stderr)
        return {"first_gen": first_gen, "stopped": max(stops.values()) - nan_at, "relaunched": done - nan_at,
                "after_slowest_stop": done - max(stops.values()), "rest_rps": rest_rps, "fault_requests":
                fault_requests, "rest_cpu": rest_cpu, "etcd_cpu": etcd_cpu}
    finally:
        for a in agents.values():
            a._closing.set()
            a._wake.set()
        for a in agents.values():
            a.close()
        etcd.stop()


def scale_rows(sizes: list[int], poll: bool = False, procs: int = PROCS) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for watch in (True, False) if poll else (True,):
        for n in sizes:
            with tempfile.TemporaryDirectory(prefix="bench-cluster-scale-") as d:
                f = scale_trial(Path(d), n, watch=watch, procs=procs)
            p = min(procs, n)
            mode = "as threads of one process" if p == 1 else f"in {p} processes"
            how = (f"N={n} agents {mode}, {'watch' if watch else 'poll every 0.2 s (old)'}; etcd on loopback, plain "
                   "http, no TLS, no auth (a real cluster's TLS and auth are not in these figures)")
            tag = f"cluster-{n}-{'watch' if watch else 'poll'}"  # the anchors docs/multinode.md links to
            rows += [
                {"id": f"{tag}-start", "name": f"{how}: start -> every node in generation 1", "value": round(f["first_gen"], 2),
                 "unit": "s", "target": "report"},
                {"id": f"{tag}-stopped", "name": f"{how}: detection on one node -> every node stopped", "value": round(f["stopped"], 2),
                 "unit": "s", "target": "report"},
                {"id": f"{tag}-relaunched", "name": f"{how}: detection on one node -> every node relaunched", "value": round(f["relaunched"], 2),
                 "unit": "s", "target": "report"},
                {"id": f"{tag}-after-slowest-stop", "name": f"{how}: slowest stop -> every node relaunched", "value": round(f["after_slowest_stop"], 2),
                 "unit": "s", "target": "<= 5"},
                {"id": f"{tag}-rest-rps", "name": f"{how}: etcd requests at rest (all nodes)", "value": round(f["rest_rps"], 1),
                 "unit": "req/s", "target": "report"},
                {"name": f"{how}: etcd requests per fault (stop + relaunch, all nodes)",
                 "value": int(f["fault_requests"]), "unit": "req", "target": "report"},
                {"name": f"{how}: CPU at rest, the N agents together (sum over their processes)",
                 "value": round(100 * f["rest_cpu"], 1), "unit": "% core", "target": "report"},
                {"id": f"{tag}-etcd-cpu", "name": f"{how}: CPU at rest, etcd", "value": round(100 * f["etcd_cpu"], 1), "unit": "% core",
                 "target": "report"},
            ]
    return rows


SCALE = [int(x) for x in os.environ.get("BENCH_CLUSTER_SCALE", "16,64,256").split(",") if x.strip()]


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
    # The daemons run tests/cluster/daemons.node_config: its settings that are not the defaults are
    # named, so a reader does not take these figures for the defaults'.
    how = (f"3 daemons + real etcd on one machine, NaN on one node, {TRIALS} trials; etcd on loopback, plain http, "
           "no TLS, no auth; not the defaults: policy.backoff_initial_s 0 and backoff_jitter 0 (relaunched at once), "
           "cluster.lease_ttl_s 3 (default 10), request_timeout_s 1 (default 2), checkpoints.load_test false, validation off, "
           "shutdown.grace_s 5")
    return scale_rows(SCALE) + [
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
    import structlog

    structlog.configure(logger_factory=structlog.PrintLoggerFactory(open(os.devnull, "w")))
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill still stops the etcd it started
    args = sys.argv[1:]
    if args[:1] == ["scale"]:
        for row in scale_rows([int(a) for a in args[1:] if a.isdigit()], poll="poll" in args):
            print(f"{row['name']:90s} {row['value']:>8} {row['unit']:6s} target {row['target']}", flush=True)
        sys.exit(0)
    for row in run():
        print(f"{row['name']:90s} {row['value']:>8} {row['unit']:4s} target {row['target']}")
