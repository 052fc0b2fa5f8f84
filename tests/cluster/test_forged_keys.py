"""Issue 26's forged-key attacks against a real etcd and real agents: a writer who is not the
leader (or not a node at all) writes the run's keys; the nodes ignore them with a warning and
the run goes on. The rules alone: test_trust.py."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from supervisor.cluster.agent import ClusterAgent
from supervisor.cluster.coord import Rules, WritePlan
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.runkeys import Keys, Plan
from tests.cluster.etcdserver import EtcdServer
from tests.cluster.test_agent import Node, barrier, nodes
from tests.util import wait_for

RULES = Rules(nodes=2, min_nodes=2, wait_for_nodes_s=2.0, lease_ttl_s=2.0)


@pytest.fixture
def prefix() -> str:
    return f"/tsup/forged-{uuid.uuid4().hex[:8]}"


def ignored(n: Node, key: str) -> bool:
    return any(e == "cluster_key_ignored" and key in msg for e, msg in n.events)


def close(ns: list[Node]) -> None:
    for n in ns:
        n.agent.close()


def test_a_give_up_written_by_a_non_member_is_ignored_and_the_run_goes_on(etcd: EtcdServer, prefix: str) -> None:
    ns = nodes(etcd, prefix, RULES, n=2)
    with ThreadPoolExecutor(2) as pool:
        try:
            [f.result(timeout=15) for f in barrier(pool, ns)]
            EtcdClient([etcd.endpoint]).put(Keys(prefix).gave_up("intruder"), "restart budget spent")
            for n in ns:
                wait_for(lambda: ignored(n, "/gave_up/intruder"), timeout=10, what="the forged give-up ignored")
            ns[0].agent.request_end("nan", "loss is nan", 5, 5, "restart")  # the run goes on: no give-up
            wait_for(lambda: ns[1].stops, timeout=10, what="n2 told to stop")
            assert {f.result(timeout=15).gen for f in barrier(pool, ns)} == {2}
        finally:
            close(ns)


def test_a_plan_not_written_by_the_leader_restarts_nothing(etcd: EtcdServer, prefix: str) -> None:
    ns = nodes(etcd, prefix, RULES, n=2)
    with ThreadPoolExecutor(2) as pool:
        try:
            real = [f.result(timeout=15) for f in barrier(pool, ns)][0]
            # The writer copies the real plan (it can read it) and moves the rendezvous to its host.
            forged = Plan(2, real.nodes, None, real.leader, "6.6.6.6", "forged", lives=real.lives, lease=real.lease + 1)
            EtcdClient([etcd.endpoint]).put(Keys(prefix).plan, forged.to_json())
            for n in ns:
                wait_for(lambda: ignored(n, "/plan"), timeout=10, what="the forged plan ignored")
            assert all(n.stops == [] and n.agent.plan is not None and n.agent.plan.gen == 1 for n in ns)
            ns[1].agent.request_end("crash", "exit 1", None, None, "restart")  # the leader's next plan replaces it
            wait_for(lambda: ns[0].stops, timeout=10, what="n1 told to stop")
            plans = [f.result(timeout=15) for f in barrier(pool, ns)]
            assert {(p.gen, p.master_addr) for p in plans} == {(3, "127.0.0.1")}  # past the forged number
        finally:
            close(ns)


def test_a_leader_key_planted_without_a_lease_times_out_to_an_election(etcd: EtcdServer, prefix: str) -> None:
    EtcdClient([etcd.endpoint]).put(Keys(prefix).leader, "intruder")  # before any node starts
    ns = nodes(etcd, prefix, RULES, n=2)
    with ThreadPoolExecutor(2) as pool:
        try:
            plans = [f.result(timeout=RULES.lease_ttl_s + 15) for f in barrier(pool, ns)]
            assert {p.gen for p in plans} == {1} and plans[0].leader in ("n1", "n2")
            assert all(ignored(n, "/leader") for n in ns)
            assert any(e == "cluster_leader" and "did not hold up" in msg for n in ns for e, msg in n.events)
        finally:
            close(ns)


def test_an_agent_writes_plans_only_while_the_leader_key_is_on_its_lease(etcd: EtcdServer, prefix: str) -> None:
    ns = nodes(etcd, prefix, RULES, n=2)
    with ThreadPoolExecutor(2) as pool:
        try:
            [f.result(timeout=15) for f in barrier(pool, ns)]
            follower: ClusterAgent = next(n.agent for n in ns if n.agent.view.leader != n.agent.node_id)
            keys = Keys(prefix)
            rev = EtcdClient([etcd.endpoint]).get(keys.plan).mod_revision  # type: ignore[union-attr]
            # The command a confused follower would carry out: the transaction refuses it.
            follower._one(WritePlan(Plan(2, ("n1",), None, follower.node_id, "127.0.0.1", "not the leader"), rev))
            assert EtcdClient([etcd.endpoint]).get(keys.plan).mod_revision == rev  # type: ignore[union-attr]
        finally:
            close(ns)
