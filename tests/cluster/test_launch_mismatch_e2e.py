"""Two real daemons and a real etcd, n2 started with a different ``--seed`` and another
``[policy] max_restarts`` (issue 26 build 3): no generation starts, and both nodes say which keys
differ, with each node's value, then give up (exit 3) after ``wait_for_nodes_s``. Their own paths,
names and state dirs differ too and are not a difference. Then two agents: the odd node restarted
with the others' launch lets the generation start."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from supervisor.cluster.agent import ClusterAgent
from supervisor.cluster.coord import Rules
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.runkeys import Keys, Plan
from tests.cluster.daemons import launches, node_config, start
from tests.cluster.etcdserver import EtcdServer
from tests.cluster.test_cluster_e2e import _prefix
from tests.conftest import history
from tests.util import wait_for

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


def test_the_odd_node_restarted_with_the_others_launch_joins_and_the_generation_starts(etcd: EtcdServer) -> None:
    """Two agents in threads: n2 waits with another seed, both are told; n2's daemon restarts
    with n1's launch (a new agent, a new lease) and the generation starts on both."""
    rules = Rules(nodes=2, min_nodes=2, wait_for_nodes_s=60.0, lease_ttl_s=3.0)
    events: dict[str, list[tuple[str, str]]] = {"n1": [], "n2": []}

    prefix = _prefix()

    def make(node: str) -> ClusterAgent:
        a = ClusterAgent(EtcdClient([etcd.endpoint], timeout_s=1.0), Keys(prefix), node, "127.0.0.1", rules,
                         on_stop=lambda r: None, on_event=lambda e, lvl, msg, data: events[node].append((e, msg)),
                         poll_s=0.05)
        a.start()
        return a

    seed1 = {"seeds.--seed": "1", "~names": '["n1"]'}
    seed2 = {"seeds.--seed": "2", "~names": '["n2"]'}
    with ThreadPoolExecutor(3) as pool:
        n1, n2 = make("n1"), make("n2")
        try:
            f1 = pool.submit(n1.wait_for_generation, [], digest=seed1)
            pool.submit(n2.wait_for_generation, [], digest=seed2)
            for n in ("n1", "n2"):
                told = wait_for(lambda: [m for e, m in events[n] if e == "cluster_launch_mismatch"], timeout=20,
                                what=f"{n} names the difference")
                assert "seeds.--seed (n1: 1; n2: 2)" in told[0], told
            assert not f1.done()  # no generation over a difference
            # The follower watches no digests: the leader's note (P/mismatch, on its lease) tells it.
            # Polled: under load a node's view may not have named the leader yet at this instant.
            follower = wait_for(lambda: next((a for a in (n1, n2) if a.view.leader not in (None, a.node_id)), None),
                                timeout=10, what="a follower whose view names the leader")
            note = wait_for(lambda: follower._following() and follower.view.mismatch, timeout=10,
                            what="the leader's note in the follower's view")
            assert "seeds.--seed (n1: 1; n2: 2)" in note.text and set(note.nodes) == {"n1", "n2"}
            n2.close()  # the odd daemon stops (its lease and digest go) and starts again with n1's launch
            n2 = make("n2")
            f2 = pool.submit(n2.wait_for_generation, [], digest={**seed1, "~names": '["n2"]'})
            plans: list[Plan] = [f1.result(timeout=20), f2.result(timeout=20)]
            # One plan on both; the leader is ranked first, and under load the lease of either may
            # have carried the leadership (CI saw n2 lead after its restart).
            assert {p.gen for p in plans} == {1} and len({p.nodes for p in plans}) == 1, plans
            assert sorted(plans[0].nodes) == ["n1", "n2"] and plans[0].nodes[0] == plans[0].leader, plans
        finally:
            n1.close()
            n2.close()
