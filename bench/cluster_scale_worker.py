"""One worker process of bench_cluster.py's scale bench (issue 26 build 5): runs its share of the
N node agents (:class:`ClusterAgent`, each with its own etcd client, lease and watch) with their
stand-in jobs, so that N agents spread over P processes (P cores) rather than one interpreter
lock. Spawned as ``python bench/cluster_scale_worker.py SPEC_JSON`` by the parent, which owns etcd.

Protocol (one JSON object a line). The worker builds its agents and says ``{"ready": true}``; then
reads commands on stdin and reports on stdout:

- ``{"cmd": "go"}``: start the agents and their jobs;
- ``{"cmd": "sample"}`` -> ``{"sample": {"cpu": s, "requests": n}}`` (this process's CPU seconds,
  the requests its clients sent so far);
- ``{"cmd": "nan", "node": id}``: that node's daemon saw a NaN (request_end, its job stops);
- ``{"cmd": "settled"}`` -> ``{"settled": bool}`` (every agent's record says gen 2 running);
- ``{"cmd": "quit"}``: close the agents, report ``{"events": {...}}``, exit.

Unprompted: ``{"launch": gen, "node": id, "t": wall}`` and ``{"stop": id, "t": wall}``.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

_out_lock = threading.Lock()


def say(obj: dict[str, object]) -> None:
    with _out_lock:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()


def main(spec: dict) -> None:
    from bench_cluster import _Counting
    from supervisor.cluster.agent import ClusterAgent
    from supervisor.cluster.coord import Rules
    from supervisor.cluster.runkeys import Keys

    n = int(spec["n"])
    rules = Rules(nodes=n, min_nodes=n, wait_for_nodes_s=60.0, lease_ttl_s=10.0)
    keys = Keys(spec["prefix"])
    count = _Counting()
    lock = threading.Lock()
    events: Counter[str] = Counter()
    stopped = {node: threading.Event() for node in spec["nodes"]}
    agents: dict[str, ClusterAgent] = {}

    def note(event: str, _level: str, msg: str, _data: object) -> None:
        with lock:
            events[event] += 1
        if event == "cluster_leader":  # who leads, when: a second one is worth a look
            print(f"{time.time():.3f} {msg}", file=sys.stderr, flush=True)

    def on_stop(node: str):
        def stop(_req: object) -> None:  # the stand-in job stops at once
            if not stopped[node].is_set():
                say({"stop": node, "t": time.time()})
            stopped[node].set()
        return stop

    def job(node: str) -> None:  # the daemon's launch loop, with a job that runs until stopped
        a = agents[node]
        for gen in (1, 2):
            plan = a.wait_for_generation([10, 20] if gen == 2 else [])
            say({"launch": plan.gen, "node": node, "t": time.time()})
            if gen == 1:
                stopped[node].wait(600)

    for node in spec["nodes"]:
        agents[node] = ClusterAgent(count.client(spec["endpoint"]), keys, node, "127.0.0.1", rules,
                                    on_stop=on_stop(node), on_event=note, watch=bool(spec["watch"]))
    say({"ready": True})
    try:
        for line in sys.stdin:
            cmd = json.loads(line)
            what = cmd["cmd"]
            if what == "go":
                for a in agents.values():
                    a.start()
                for node in agents:
                    threading.Thread(target=job, args=(node,), daemon=True).start()
            elif what == "sample":
                t = os.times()
                say({"sample": {"cpu": t.user + t.system, "requests": count.n}})
            elif what == "nan":
                node = cmd["node"]
                agents[node].request_end("nan", "loss is nan at step 25", 25, 25, "rollback")
                stopped[node].set()  # the daemon stops its own job (the parent timed it at the NaN)
            elif what == "settled":
                say({"settled": all(a._published is not None and a._published.gen == 2
                                    and a._published.phase.value == "running" for a in agents.values())})
            elif what == "quit":
                break
    finally:
        for a in agents.values():
            a._closing.set()
            a._wake.set()
        for a in agents.values():
            a.close()
        say({"events": dict(events)})


if __name__ == "__main__":
    import structlog

    structlog.configure(logger_factory=structlog.PrintLoggerFactory(open(os.devnull, "w")))
    main(json.loads(sys.argv[1]))
