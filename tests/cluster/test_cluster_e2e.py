"""Three real daemons, one per simulated node, and a real etcd: a failure on one node stops all
three and they resume together from the same step; a killed daemon is a lost node; an etcd
restart mid-run changes nothing."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.cluster.daemons import all_finish, launches, node_config, start
from tests.cluster.etcdserver import EtcdServer
from tests.conftest import history, pid_alive
from tests.util import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
NODES = ("n1", "n2", "n3")


def _status(state_dir: Path, phases: set[str] | None = {"running"}, cli: bool = False) -> dict | None:
    """The cluster block of a node's `status --json` once it lists every node (in ``phases``).
    Asked over the control socket from this process (what `status --json` prints): polled back to
    back, a CLI process per call spent a core; ``cli``: through the command itself."""
    from supervisor.ops.control import ControlError, DaemonNotRunning
    from supervisor.ops.controlclient import request

    if cli:
        r = subprocess.run([sys.executable, "-m", "supervisor", "status", "--json", "--state-dir", str(state_dir)],
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            return None
        st = json.loads(r.stdout)
    else:
        try:
            st = request(state_dir, "status", timeout=10.0)
        except (DaemonNotRunning, ControlError, OSError):
            return None
    c = st.get("cluster") or {}
    nodes = c.get("nodes") or {}
    if phases is None:
        return c
    return c if len(nodes) == len(NODES) and all(v["phase"] in phases for v in nodes.values()) else None


def _prefix() -> str:
    return f"/tsup/e2e-{uuid.uuid4().hex[:8]}"


def test_nan_on_one_node_stops_all_three_and_they_resume_from_the_same_step(
        etcd: EtcdServer, tmp_path: Path) -> None:
    prefix = _prefix()
    ds = {n: start(tmp_path, n, node_config(tmp_path, n, etcd, prefix, nodes=3,
                                            job_args=["60", "0.05", "10", "n2", "38"])) for n in NODES}
    all_finish(ds, 180)
    runs = {n: launches(tmp_path, n) for n in NODES}
    for n, ls in runs.items():
        assert [int(x["TSUP_GENERATION"]) for x in ls] == [1, 2], (n, ls)
        assert {x["TSUP_NNODES"] for x in ls} == {"3"} and {x["MASTER_ADDR"] for x in ls} == {"127.0.0.1"}
    assert sorted(runs[n][0]["TSUP_NODE_RANK"] for n in NODES) == ["0", "1", "2"]
    # every node resumed generation 2 from the same step: the newest verified everywhere before the
    # NaN at 38. The nodes' jobs do not move in lockstep: one may not have saved (or verified) 30
    # yet when the NaN stops every node, and then 20 is the newest common step (seen 2 in ~22
    # runs), on a loaded CI machine even 10. What must hold: one step for all, a save before 38.
    resumed = {runs[n][1]["TSUP_RESUME_STEP"] for n in NODES}
    assert len(resumed) == 1 and resumed <= {"30", "20", "10"}, resumed
    for n in NODES:
        h = history(tmp_path / n / "state")
        first = h["attempts"][0]
        assert first["cause"] == "nan", (n, first)
        events = {e["event"] for e in h["events"]}
        assert {"cluster_generation_joined", "cluster_started"} <= events, (n, events)
        if n != "n2":
            assert "cluster_generation_ended" in events  # told by the cluster, not seen here


def test_a_killed_daemon_is_a_lost_node_the_others_stop_within_ttl_and_go_on(
        etcd: EtcdServer, tmp_path: Path) -> None:
    prefix, ttl = _prefix(), 3.0
    ds = {n: start(tmp_path, n, node_config(tmp_path, n, etcd, prefix, nodes=3, min_nodes=2, lease_ttl_s=ttl,
                                            wait_for_nodes_s=2.0, job_args=["100000", "0.05", "10"]))
          for n in NODES}
    try:
        for n in NODES:
            wait_for(lambda: launches(tmp_path, n), timeout=60, what=f"{n}'s first launch")
        jobs = {n: launches(tmp_path, n)[0]["pid"] for n in NODES}
        victim = "n3"
        ds[victim].proc.send_signal(signal.SIGKILL)  # the node dies: its daemon and its job
        os.killpg(os.getpgid(jobs[victim]), signal.SIGKILL)
        killed_at = time.monotonic()
        for n in ("n1", "n2"):
            wait_for(lambda: not pid_alive(jobs[n]), timeout=ttl + 15, what=f"{n}'s job stopped")
        stopped_in = time.monotonic() - killed_at
        assert stopped_in < ttl + 5 + 5  # TTL + etcd's expiry slack + the job's stop (grace 5 s)
        for n in ("n1", "n2"):
            ls = wait_for(lambda: launches(tmp_path, n)[1:], timeout=30, what=f"{n} relaunched")
            assert ls[0]["TSUP_GENERATION"] == "2" and ls[0]["TSUP_NNODES"] == "2"
        for n in ("n1", "n2"):
            assert wait_for(lambda: any(e["event"] == "cluster_generation_ended" and "n3" in (e["message"] or "")
                                            for e in history(tmp_path / n / "state")["events"]), timeout=10,
                              interval=0.5)  # a CLI process per look
        # n3's daemon comes back (same state dir: the same run continues in its ledger): it waits for
        # the next generation instead of joining the running one, which an operator restart ends
        ds["n3"] = start(tmp_path, "n3", tmp_path / "n3" / "config.toml")
        wait_for(lambda: (_status(tmp_path / "n1" / "state", phases=None) or {}).get("nodes", {}).get("n3", {})
                 .get("phase") == "waiting", timeout=30, what="n3 back and waiting")
        assert launches(tmp_path, "n3")[1:] == []
        _restart_into_generation_3_with_all(tmp_path, via="n2")
    finally:
        for d in ds.values():
            d.kill()
    for n in ("n1", "n2"):
        h = history(tmp_path / n / "state")
        assert h["attempts"][0]["cause"] == "node_lost", h["attempts"][0]


def test_etcd_restarted_mid_run_changes_nothing(etcd: EtcdServer, tmp_path: Path) -> None:
    prefix = _prefix()
    ds = {n: start(tmp_path, n, node_config(tmp_path, n, etcd, prefix, nodes=3, lease_ttl_s=5.0,
                                            job_args=["80", "0.05", "10"])) for n in NODES}
    try:
        for n in NODES:
            wait_for(lambda: launches(tmp_path, n), timeout=60, what=f"{n}'s first launch")
        # `status` on any node shows every node
        wait_for(lambda: _status(tmp_path / "n2" / "state"), timeout=10, what="n2's cluster status")
        st = _status(tmp_path / "n2" / "state", cli=True)
        assert st is not None, "`status --json` on n2 does not list every node running"
        assert set(st["nodes"]) == set(NODES) and st["generation"] == 1 and st["leader"] in NODES
        assert {v["phase"] for v in st["nodes"].values()} == {"running"}
        etcd.restart()
        codes = {n: d.wait(180) for n, d in ds.items()}
    finally:
        for d in ds.values():
            if d.proc.poll() is None:
                d.kill()
    assert codes == {"n1": 0, "n2": 0, "n3": 0}, {n: d.stderr()[-2000:] for n, d in ds.items()}
    for n in NODES:
        assert [x["TSUP_GENERATION"] for x in launches(tmp_path, n)] == ["1"]  # one generation, never stopped


def _restart_into_generation_3_with_all(tmp_path: Path, via: str) -> None:
    """An operator restart on node ``via`` ends the running generation; every node, the one that
    was away included, relaunches in generation 3 with all three nodes."""
    r = subprocess.run([sys.executable, "-m", "supervisor", "restart", "--state-dir", str(tmp_path / via / "state"),
                        "--reason", "take n3 back"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    for n in NODES:
        g3 = wait_for(lambda: [x for x in launches(tmp_path, n) if x["TSUP_GENERATION"] == "3"],
                      timeout=40, what=f"{n} in generation 3")[0]
        assert g3["TSUP_NNODES"] == "3"


def _read(p: Path) -> list[dict]:
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []


def test_a_partitioned_node_stops_before_the_others_go_on_and_rejoins_the_next_generation(
        etcd: EtcdServer, tmp_path: Path) -> None:
    """n3 reaches etcd through a relay the test cuts: a partition of n3 alone."""
    from tests.cluster.proxy import Relay

    prefix, ttl = _prefix(), 3.0
    relay = Relay(etcd.client_port)
    relay.heal()
    ds = {n: start(tmp_path, n, node_config(tmp_path, n, etcd, prefix, nodes=3, min_nodes=2, lease_ttl_s=ttl,
                                            wait_for_nodes_s=2.0, job_args=["100000", "0.05", "10"],
                                            endpoint=relay.endpoint if n == "n3" else None))
          for n in NODES}
    try:
        for n in NODES:
            wait_for(lambda: launches(tmp_path, n), timeout=60, what=f"{n}'s first launch")
        relay.cut()
        n3_stop = wait_for(lambda: _read(tmp_path / "n3" / "out" / "stops.jsonl"), timeout=ttl + 10,
                           what="the cut-off node's job stopped")[0]
        gen2 = {n: wait_for(lambda: launches(tmp_path, n)[1:], timeout=30, what=f"{n} in generation 2")[0]
                for n in ("n1", "n2")}
        assert {g["TSUP_GENERATION"] for g in gen2.values()} == {"2"} and {g["TSUP_NNODES"] for g in gen2.values()} == {"2"}
        # never two generations at once: the minority's job was gone before the majority relaunched
        assert n3_stop["gen"] == 1 and n3_stop["at"] < min(g["at"] for g in gen2.values())
        assert launches(tmp_path, "n3")[1:] == []  # it waits, not in generation 2
        relay.heal()
        # the next generation takes it back: an operator restart on n1 ends generation 2
        _restart_into_generation_3_with_all(tmp_path, via="n1")
    finally:
        relay.cut()
        for d in ds.values():
            d.kill()


def test_fewer_than_min_nodes_after_the_wait_gives_up_with_exit_3(etcd: EtcdServer, tmp_path: Path) -> None:
    prefix = _prefix()
    # The wait also bounds the first barrier: long enough for the second daemon's start on a
    # loaded machine (2 s gave the run up before its first launch, now and then).
    ds = {n: start(tmp_path, n, node_config(tmp_path, n, etcd, prefix, nodes=2, min_nodes=2, lease_ttl_s=3.0,
                                            wait_for_nodes_s=8.0, job_args=["100000", "0.05", "10"]))
          for n in ("n1", "n2")}
    try:
        for n in ds:
            wait_for(lambda: launches(tmp_path, n), timeout=60, what=f"{n}'s first launch")
        job = launches(tmp_path, "n2")[0]["pid"]
        ds["n2"].proc.send_signal(signal.SIGKILL)
        os.killpg(os.getpgid(job), signal.SIGKILL)
        assert ds["n1"].wait(60) == 3
    finally:
        for d in ds.values():
            d.kill()
    h = history(tmp_path / "n1" / "state")
    gave = [e for e in h["events"] if e["event"] == "gave_up"]
    assert gave and "min_nodes = 2" in gave[-1]["message"], gave
    assert h["attempts"][0]["cause"] == "node_lost"


def test_a_partition_by_network_namespaces_the_minority_stops_and_rejoins(tmp_path: Path) -> None:
    """Each node in a network namespace of its own on a bridge the test creates (etcd on the
    bridge's address); n3's link is cut: a partition of n3 from etcd and the other nodes."""
    from tests.cluster.daemons import start_in
    from tests.cluster.etcdserver import Unavailable as NoEtcd
    from tests.cluster.netns import Bridge, Unavailable

    try:
        net = Bridge(list(NODES))
    except Unavailable as e:
        pytest.skip(f"no network namespaces here: {e}")
    ds = {}
    etcd = None
    try:
        try:
            etcd = EtcdServer(tmp_path / "etcd-data", host=net.host_ip)
            etcd.start()
        except NoEtcd as e:
            pytest.skip(f"no real etcd here: {e}")
        prefix, ttl = _prefix(), 3.0
        for n in NODES:
            cfg = node_config(tmp_path, n, etcd, prefix, nodes=3, min_nodes=2, lease_ttl_s=ttl, wait_for_nodes_s=2.0,
                              job_args=["100000", "0.05", "10"], advertise=net.addr(n))
            ds[n] = start_in(tmp_path, n, cfg, functools.partial(net.argv, n))
        for n in NODES:
            wait_for(lambda: launches(tmp_path, n), timeout=60, what=f"{n}'s first launch")
        assert {launches(tmp_path, n)[0]["TSUP_MASTER_ADDR"] for n in NODES} <= {net.addr(n) for n in NODES}
        net.cut("n3")
        n3_stop = wait_for(lambda: _read(tmp_path / "n3" / "out" / "stops.jsonl"), timeout=ttl + 10,
                           what="the cut-off node's job stopped")[0]
        gen2 = {n: wait_for(lambda: launches(tmp_path, n)[1:], timeout=30, what=f"{n} in generation 2")[0]
                for n in ("n1", "n2")}
        assert {g["TSUP_NNODES"] for g in gen2.values()} == {"2"}
        assert n3_stop["gen"] == 1 and n3_stop["at"] < min(g["at"] for g in gen2.values())  # never two at once
        net.heal("n3")
        _restart_into_generation_3_with_all(tmp_path, via="n1")
    finally:
        for d in ds.values():
            d.kill()
        if etcd is not None:
            etcd.stop()
        net.close()
