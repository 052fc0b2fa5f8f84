"""Several real supervisor daemons on one machine, one per simulated node, each with its own
state dir, checkpoint dir and config, coordinated through a real etcd."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

from tests.cluster.etcdserver import EtcdServer
from tests.conftest import ROOT, Daemon

JOB = Path(__file__).resolve().parent / "cluster_job.py"


def node_config(tmp: Path, node: str, etcd: EtcdServer, prefix: str, *, nodes: int, job_args: list[str],
                min_nodes: int = 0, lease_ttl_s: float = 3.0, wait_for_nodes_s: float = 30.0,
                endpoint: str | None = None, command: list[str] | None = None, master_port: int = 29500,
                advertise: str = "127.0.0.1") -> Path:
    d = tmp / node
    (d / "ck").mkdir(parents=True, exist_ok=True)
    shell = command is not None and len(command) == 1  # one string: run by /bin/sh (job.shell)
    command = command or [sys.executable, str(JOB), str(d / "out"), str(d / "ck"), *job_args]
    p = d / "config.toml"
    # workdir: outside any git tree, so each node's code version (its launch digest) is the
    # script's hash, not this checkout's HEAD, which a commit landing between two nodes' launches
    # would change for one of them.
    p.write_text(f"""
[job]
name = "clustertest"
workdir = "{d}"
command = {json.dumps(command)}
shell = {"true" if shell else "false"}
[state]
dir = "{d / 'state'}"
[checkpoints]
dir = "{d / 'ck'}"
load_test = false
[policy]
backoff_initial_s = 0.0
backoff_jitter = 0.0
[validation]
enabled = false
[shutdown]
grace_s = 5.0
[cluster]
endpoints = ["{endpoint or etcd.endpoint}"]
insecure = {"false" if "//127.0.0.1:" in (endpoint or etcd.endpoint) else "true"}
prefix = "{prefix}"
node_id = "{node}"
advertise_addr = "{advertise}"
nodes = {nodes}
min_nodes = {min_nodes}
lease_ttl_s = {lease_ttl_s}
wait_for_nodes_s = {wait_for_nodes_s}
request_timeout_s = 1.0
master_port = {master_port}
""")
    return p


def start(tmp: Path, node: str, config: Path) -> Daemon:
    (tmp / node / "d").mkdir(parents=True, exist_ok=True)
    return Daemon(["run", "--config", str(config)], tmp / node / "d")


def start_in(tmp: Path, node: str, config: Path, wrap: Callable[[list[str]], list[str]]) -> Daemon:
    """A daemon whose command line ``wrap`` prefixes (``ip netns exec NS``: it execs, same pid)."""
    d = tmp / node / "d"
    d.mkdir(parents=True, exist_ok=True)
    daemon = Daemon.__new__(Daemon)
    daemon.tmp, daemon.stdout_path, daemon.stderr_path = d, d / "daemon.stdout", d / "daemon.stderr"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    daemon.proc = subprocess.Popen(wrap([sys.executable, "-m", "supervisor", "--log-format", "logfmt", "run",
                                         "--config", str(config)]), cwd=str(ROOT), env=env,
                                   stdout=open(daemon.stdout_path, "wb"), stderr=open(daemon.stderr_path, "wb"),
                                   start_new_session=True)
    return daemon


def all_finish(ds: dict[str, Daemon], timeout: float) -> None:
    """Every daemon exits 0 within ``timeout`` (each one's output tails when not); whatever is
    still running when this ends is killed."""
    try:
        codes = {n: d.wait(timeout) for n, d in ds.items()}
    finally:
        for d in ds.values():
            if d.proc.poll() is None:
                d.kill()
    assert codes == {n: 0 for n in ds}, {n: d.stderr()[-3000:] + d.stdout()[-2000:] for n, d in ds.items()}


def launches(tmp: Path, node: str) -> list[dict[str, Any]]:
    p = tmp / node / "out" / "launches.jsonl"
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
