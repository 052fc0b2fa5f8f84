"""Two real daemons and a real etcd, n2 started with a different ``--seed`` and another
``[policy] max_restarts`` (issue 26 build 3): no generation starts, and both nodes say which keys
differ, with each node's value, then give up (exit 3) after ``wait_for_nodes_s``. Their own paths,
names and state dirs differ too and are not a difference."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster.daemons import launches, node_config, start
from tests.cluster.etcdserver import EtcdServer
from tests.cluster.test_cluster_e2e import _prefix
from tests.conftest import history

pytestmark = [pytest.mark.timeout(120)]


def test_a_node_with_another_seed_starts_no_generation_and_both_name_the_difference(
        etcd: EtcdServer, tmp_path: Path) -> None:
    prefix = _prefix()
    cfgs = {n: node_config(tmp_path, n, etcd, prefix, nodes=2, lease_ttl_s=3.0, wait_for_nodes_s=2.0,
                           job_args=["20", "0.05", "10", "--seed", seed]) for n, seed in (("n1", "1"), ("n2", "2"))}
    text = cfgs["n2"].read_text()
    assert "[policy]\n" in text
    cfgs["n2"].write_text(text.replace("[policy]\n", "[policy]\nmax_restarts = 3\n"))
    ds = {n: start(tmp_path, n, cfg) for n, cfg in cfgs.items()}
    try:
        codes = {n: d.wait(90) for n, d in ds.items()}
    finally:
        for d in ds.values():
            if d.proc.poll() is None:
                d.kill()
    assert codes == {"n1": 3, "n2": 3}, {n: d.stderr()[-3000:] for n, d in ds.items()}
    assert launches(tmp_path, "n1") == [] and launches(tmp_path, "n2") == []  # no generation started
    for n in ds:
        events = history(tmp_path / n / "state")["events"]
        told = [e["message"] for e in events if e["event"] == "cluster_launch_mismatch"]
        assert told, (n, [e["event"] for e in events])
        assert "argv, config.policy.max_restarts, seeds.--seed differ:" in told[0], told[0]  # only these
        assert "seeds.--seed (n1: 1; n2: 2)" in told[0] and "config.policy.max_restarts (n1: (default); n2: 3)" in told[0]
        gave = [e["message"] for e in events if e["event"] == "gave_up"]
        assert gave and "seeds.--seed" in gave[-1] and "config.policy.max_restarts" in gave[-1], (n, gave)
