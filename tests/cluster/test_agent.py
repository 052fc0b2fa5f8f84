"""Three agents (one per simulated node, in threads) against a real etcd: the first generation,
a failure on one node stopping the others, the common step, a lost node, give-up, etcd away."""

from __future__ import annotations

import signal
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from supervisor.cluster.agent import ClusterAgent, ClusterGaveUp
from supervisor.cluster.coord import NODE_LOST, Rules
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.runkeys import EndRequest, Keys, Plan
from tests.cluster.etcdserver import EtcdServer
from tests.util import wait_for


class Node:
    def __init__(self, etcd: EtcdServer, prefix: str, node_id: str, rules: Rules) -> None:
        self.stops: list[EndRequest] = []
        self.events: list[tuple[str, str]] = []
        self.agent = ClusterAgent(EtcdClient([etcd.endpoint], timeout_s=0.5), Keys(prefix), node_id, "127.0.0.1",
                                  rules, on_stop=self.stops.append,
                                  on_event=lambda e, lvl, msg, data: self.events.append((e, msg)), poll_s=0.05)
        self.agent.start()


@pytest.fixture
def prefix() -> str:
    return f"/tsup/test-{uuid.uuid4().hex[:8]}"


def nodes(etcd: EtcdServer, prefix: str, rules: Rules, n: int = 3) -> list[Node]:
    return [Node(etcd, prefix, f"n{i}", rules) for i in range(1, n + 1)]


def barrier(pool: ThreadPoolExecutor, ns: list[Node], steps: dict[str, list[int]] | None = None) -> list[Future[Plan]]:
    return [pool.submit(n.agent.wait_for_generation, (steps or {}).get(n.agent.node_id, [])) for n in ns]


RULES = Rules(nodes=3, min_nodes=2, wait_for_nodes_s=2.0, lease_ttl_s=2.0)


def test_generations_end_together_and_resume_from_the_common_step(etcd: EtcdServer, prefix: str) -> None:
    ns = nodes(etcd, prefix, RULES)
    with ThreadPoolExecutor(3) as pool:
        try:
            plans = [f.result(timeout=15) for f in barrier(pool, ns)]
            assert {p.gen for p in plans} == {1} and len({p.nodes for p in plans}) == 1
            ranks = sorted(p.rank(n.agent.node_id) for p, n in zip(plans, ns))
            assert ranks == [0, 1, 2] and plans[0].master_addr == "127.0.0.1"
            # n2 fails: the others are told to stop, n2 is not (it stopped itself)
            ns[1].agent.request_end("nan", "loss is nan at step 70", 70, 65, "rollback")
            for n in (ns[0], ns[2]):
                wait_for(lambda: n.stops, timeout=10, what=f"{n.agent.node_id} told to stop")
                assert n.stops[0].cause == "nan" and n.stops[0].by == "n2"
            assert ns[1].stops == []
            # each publishes its verified steps; the newest common one before the onset wins
            steps = {"n1": [20, 40, 60, 80], "n2": [20, 40, 60], "n3": [40, 60, 80]}
            plans = [f.result(timeout=15) for f in barrier(pool, ns, steps)]
            assert {(p.gen, p.step) for p in plans} == {(2, 60)}
            ns[0].agent.request_end("crash", "exit 1", None, None, "restart")
            ns[2].agent.request_end("crash", "exit 1", None, None, "restart")
            wait_for(lambda: ns[1].stops, timeout=10)
            # n3's own crash either raced n1's request and folded into it (the first write wins, a
            # transaction), or came after the watch had told n3 to stop for n1's (then it asks
            # nothing). Either way generation 2 has one end request (one key, written first-wins).
            def settled() -> bool:
                folded = any(e == "cluster_generation_end_folded" for e, _ in ns[2].events + ns[0].events)
                return folded or any(s.by == "n1" for s in ns[2].stops)
            wait_for(settled, timeout=10, what="n3's crash folded into n1's request, or n3 stopped by it")
        finally:
            for n in ns:
                n.agent.close()


def test_a_lost_node_ends_the_generation_and_min_nodes_go_on_then_give_up(etcd: EtcdServer, prefix: str) -> None:
    ns = nodes(etcd, prefix, RULES)
    with ThreadPoolExecutor(3) as pool:
        try:
            [f.result(timeout=15) for f in barrier(pool, ns)]
            leader = wait_for(lambda: ns[0].agent.view.leader, timeout=5)
            victim = next(n for n in ns if n.agent.node_id != leader)
            victim.agent._closing.set()  # the daemon dies: no more keepalives, no revoke
            victim.agent._thread.join(5)  # type: ignore[union-attr]
            others = [n for n in ns if n is not victim]
            for n in others:
                wait_for(lambda: n.stops, timeout=RULES.lease_ttl_s + 8, what="node_lost stop")
                assert n.stops[0].cause == NODE_LOST and victim.agent.node_id in n.stops[0].summary
            plans = [f.result(timeout=15) for f in barrier(pool, others)]  # after wait_for_nodes_s: 2 >= min 2
            assert {len(p.nodes) for p in plans} == {2} and victim.agent.node_id not in plans[0].nodes
            # one more gone: 1 < min_nodes -> everyone left gives up
            follower = next(n for n in others if n.agent.node_id != leader)
            follower.agent.close()  # revoked at once
            lead = next(n for n in others if n.agent.node_id == leader)
            wait_for(lambda: lead.stops[1:], timeout=10)
            with pytest.raises(ClusterGaveUp, match="min_nodes = 2"):
                lead.agent.wait_for_generation([])
        finally:
            for n in ns:
                n.agent.close()


def test_a_node_that_gives_up_ends_the_run_everywhere(etcd: EtcdServer, prefix: str) -> None:
    ns = nodes(etcd, prefix, RULES)
    with ThreadPoolExecutor(3) as pool:
        try:
            [f.result(timeout=15) for f in barrier(pool, ns)]
            ns[2].agent.request_end("nan", "budget spent", 5, 5, "give_up")
            ns[2].agent.close(gave_up="restart budget spent")  # the daemon gives up and leaves
            waiting = barrier(pool, ns[:2])
            for f in waiting:
                with pytest.raises(ClusterGaveUp, match="n3 gave up"):
                    f.result(timeout=15)
        finally:
            for n in ns:
                n.agent.close()


def test_etcd_away_shorter_than_the_fence_changes_nothing_longer_fences(etcd: EtcdServer, prefix: str) -> None:
    rules = Rules(nodes=2, min_nodes=2, wait_for_nodes_s=1.0, lease_ttl_s=3.0)  # the fence: 2/3 TTL + 1 s
    ns = nodes(etcd, prefix, rules, n=2)
    with ThreadPoolExecutor(2) as pool:
        try:
            [f.result(timeout=15) for f in barrier(pool, ns)]
            etcd.restart()  # a quick restart: the leases survive, nobody stops
            wait_for(lambda: all(n.agent._reachable for n in ns) and all(
                e == "cluster_etcd_back" for n in ns for e, _ in n.events[-1:]), timeout=10)
            assert all(n.stops == [] for n in ns)
            etcd.stop()
            for n in ns:  # cut off past the fence: each stops its own job (a generation without it could start)
                wait_for(lambda: n.stops, timeout=rules.lease_ttl_s + 8, what="fencing stop")
                assert n.stops[0].cause == NODE_LOST and "lost contact with etcd" in n.stops[0].summary
            etcd.start()
            plans = [f.result(timeout=20) for f in barrier(pool, ns)]
            assert {p.gen for p in plans} == {2}  # back together in a new generation
        finally:
            for n in ns:
                n.agent.close()


def test_etcd_paused_past_the_lease_ttl_keeps_healthy_jobs_running_and_books_nothing(
        etcd: EtcdServer, prefix: str) -> None:
    rules = Rules(nodes=2, min_nodes=2, wait_for_nodes_s=30.0, lease_ttl_s=2.0)  # the fence: 2/3 TTL + 30 s
    ns = nodes(etcd, prefix, rules, n=2)
    assert etcd.proc is not None
    with ThreadPoolExecutor(2) as pool:
        try:
            [f.result(timeout=15) for f in barrier(pool, ns)]
            etcd.proc.send_signal(signal.SIGSTOP)  # an outage: etcd answers no one
            try:
                since = time.monotonic()
                wait_for(lambda: all(not n.agent._reachable for n in ns) and time.monotonic() - since
                         > rules.lease_ttl_s + 1, timeout=20, what="etcd away past the lease TTL")
            finally:
                etcd.proc.send_signal(signal.SIGCONT)
            # Back: the leases may have expired at once; every node registers again within the grace.
            wait_for(lambda: all(n.agent._reachable and n.agent.view.leader and len(n.agent.status(wait_s=2)["nodes"]) == 2
                                 and time.monotonic() - n.agent.coord.contact_since > rules.lease_ttl_s + 0.5
                                 for n in ns), timeout=20, what="both registered again, past the grace")
            assert all(n.stops == [] for n in ns)  # no fence, no node_lost: nothing booked
            assert EtcdClient([etcd.endpoint]).get(Keys(prefix).end(1)) is None
            assert all(n.agent.plan is not None and n.agent.plan.gen == 1 for n in ns)
            ns[0].agent.request_end("nan", "loss is nan", 5, 5, "restart")  # the run still works
            wait_for(lambda: ns[1].stops, timeout=10, what="n2 told to stop")
            assert {f.result(timeout=15).gen for f in barrier(pool, ns)} == {2}
        finally:
            for n in ns:
                n.agent.close()


def test_the_leader_lost_another_takes_over_and_goes_on(etcd: EtcdServer, prefix: str) -> None:
    ns = nodes(etcd, prefix, RULES)
    with ThreadPoolExecutor(3) as pool:
        try:
            [f.result(timeout=15) for f in barrier(pool, ns)]
            leader = wait_for(lambda: ns[0].agent.view.leader, timeout=5)
            victim = next(n for n in ns if n.agent.node_id == leader)
            victim.agent._closing.set()  # the leader's daemon dies: its lease (and the leader key) expire
            victim.agent._thread.join(5)  # type: ignore[union-attr]
            others = [n for n in ns if n is not victim]
            for n in others:
                wait_for(lambda: n.stops, timeout=RULES.lease_ttl_s + 8, what="node_lost stop")
                assert n.stops[0].cause == NODE_LOST and leader in n.stops[0].summary
            plans = [f.result(timeout=15) for f in barrier(pool, others)]
            assert {p.gen for p in plans} == {2} and plans[0].leader != leader and leader not in plans[0].nodes
        finally:
            for n in ns:
                n.agent.close()


def test_started_while_etcd_is_away_the_nodes_wait_then_register_and_start(etcd: EtcdServer, prefix: str) -> None:
    etcd.stop()
    rules = Rules(nodes=2, min_nodes=2, wait_for_nodes_s=5.0, lease_ttl_s=3.0)
    ns = nodes(etcd, prefix, rules, n=2)
    with ThreadPoolExecutor(2) as pool:
        try:
            waiting = barrier(pool, ns)
            wait_for(lambda: all(any(e == "cluster_etcd_unreachable" for e, _ in n.events) for n in ns), timeout=10)
            assert not any(f.done() for f in waiting)  # no generation decided blind
            etcd.start()
            assert {f.result(timeout=15).gen for f in waiting} == {1}
        finally:
            for n in ns:
                n.agent.close()
