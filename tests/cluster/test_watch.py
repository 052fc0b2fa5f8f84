"""The key watch against a real etcd: a change reaches the copy through the stream (no read), a
dropped stream resumes from the last revision without missing a change, a compacted one reads
everything once; two agents at rest send etcd nothing but lease keepalives, and a failure on one
still stops the other through the watch; a follower rebuilds its view at once for the plan, for
the other nodes' records at most once a second."""

from __future__ import annotations

import http.client
import threading
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from supervisor.cluster.agent import ClusterAgent
from supervisor.cluster.coord import Rules
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.mirror import OPENING, KeyMirror
from supervisor.cluster.runkeys import EndRequest, Keys, NodeRecord, Phase, Plan
from tests.cluster.etcdserver import EtcdServer
from tests.cluster.proxy import Relay
from tests.util import wait_for


class Tally(EtcdClient):
    """A real client that counts the requests it sends, by path."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: Counter[str] = Counter()
        self._tally_lock = threading.Lock()

    def _count(self, path: str) -> None:
        with self._tally_lock:
            self.sent[path] += 1

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self._count(path)
        return super()._post(path, body)

    def stream(self, path: str, body: dict[str, Any], idle_s: float | None
               ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse, str]:
        self._count(path)
        return super().stream(path, body, idle_s)

    def reads(self) -> int:
        with self._tally_lock:
            return self.sent["/v3/kv/range"]


def keys_of(m: KeyMirror) -> dict[str, str] | None:
    snap = m.snapshot()
    return None if snap is None else {kv.key.rsplit("/", 1)[1]: kv.value for kv in snap[1]}


def test_the_copy_follows_changes_and_a_dropped_watch_misses_none(etcd: EtcdServer) -> None:
    prefix = f"/tsup/watch-{uuid.uuid4().hex[:8]}/"
    direct = EtcdClient([etcd.endpoint])
    relay = Relay(etcd.client_port)
    relay.heal()
    via = Tally([relay.endpoint], timeout_s=0.5)
    direct.put(prefix + "a", "1")
    direct.put(prefix + "b", "2")
    urgent: list[str] = []  # the agent acts at once on a change of such a key (here: c)
    mirror = KeyMirror(via, prefix, on_change=lambda: None, idle_s=60, urgent=lambda key: key.endswith("/c"),
                       on_urgent=lambda: urgent.append("c"))
    mirror.start()
    try:
        wait_for(lambda: keys_of(mirror) == {"a": "1", "b": "2"}, timeout=10, what="the first full read")
        assert via.reads() == 1
        direct.put(prefix + "c", "3")
        direct.put("/elsewhere/" + uuid.uuid4().hex, "x")  # another prefix: not in the copy
        wait_for(lambda: keys_of(mirror) == {"a": "1", "b": "2", "c": "3"}, timeout=10, what="c through the watch")
        wait_for(lambda: urgent == ["c"], timeout=10, what="c's change called on_urgent")
        # dropped: the changes made meanwhile arrive when it is re-opened from the last revision + 1
        relay.cut()
        wait_for(lambda: mirror.snapshot() is None, timeout=10, what="the drop noticed")
        direct.put(prefix + "d", "4")
        direct.delete(prefix + "a")
        direct.put(prefix + "c", "33")
        relay.heal()
        wait_for(lambda: keys_of(mirror) == {"b": "2", "c": "33", "d": "4"}, timeout=15, what="resumed")
        assert via.reads() == 1 and via.sent["/v3/watch"] >= 2  # resumed, not re-read
        # dropped past a compaction: one full read, then watching again
        relay.cut()
        wait_for(lambda: mirror.snapshot() is None, timeout=10, what="the second drop noticed")
        direct.delete(prefix + "b")
        direct.compact(direct.put(prefix + "e", "5"))
        relay.heal()
        wait_for(lambda: keys_of(mirror) == {"c": "33", "d": "4", "e": "5"}, timeout=15, what="re-read after compaction")
        assert via.reads() == 2
        direct.put(prefix + "f", "6")
        wait_for(lambda: (keys_of(mirror) or {}).get("f") == "6", timeout=10, what="watching again")
        assert urgent == ["c", "c"]  # c's second change (resumed); a, b, d, e, f are not urgent
    finally:
        mirror.close()
        relay.cut()


def test_agents_at_rest_send_only_keepalives_and_a_failure_still_reaches_them(etcd: EtcdServer) -> None:
    rules = Rules(nodes=2, min_nodes=2, wait_for_nodes_s=2.0, lease_ttl_s=2.0)  # a keepalive every 0.5 s
    keys = Keys(f"/tsup/test-{uuid.uuid4().hex[:8]}")
    clients = [Tally([etcd.endpoint], timeout_s=0.5) for _ in range(2)]
    stops: list[list[EndRequest]] = [[], []]
    agents = [ClusterAgent(c, keys, f"n{i + 1}", "127.0.0.1", rules, on_stop=stops[i].append,
                           on_event=lambda *a: None, poll_s=0.05) for i, c in enumerate(clients)]
    for a in agents:
        a.start()
    try:
        with ThreadPoolExecutor(2) as pool:
            plans = [f.result(timeout=20) for f in [pool.submit(a.wait_for_generation, []) for a in agents]]
        assert {p.gen for p in plans} == {1}
        wait_for(lambda: all({v["phase"] for v in a.status(wait_s=5)["nodes"].values()} == {"running"} and
                             len(a.status()["nodes"]) == 2 for a in agents), timeout=10, what="both running, as each says")
        before = [Counter(c.sent) for c in clients]
        wait_for(lambda: all(c.sent["/v3/lease/keepalive"] - b["/v3/lease/keepalive"] >= 3
                             for c, b in zip(clients, before)), timeout=20, what="three keepalives each")
        at_rest = [Counter(c.sent) - b for c, b in zip(clients, before)]
        # 30 turns each and no read or write (a watch silent for IDLE_S is re-opened: no read either)
        assert all(set(r) - {"/v3/watch"} == {"/v3/lease/keepalive"} for r in at_rest), at_rest
        reads = clients[0].reads()
        agents[1].request_end("nan", "loss is nan at step 7", 7, 7, "rollback")
        wait_for(lambda: stops[0], timeout=10, what="n1 told to stop")
        assert stops[0][0].by == "n2" and clients[0].reads() == reads  # through the watch, not a read
    finally:
        for a in agents:
            a.close()


def test_a_follower_watches_only_what_it_acts_on_and_reads_every_record_once_it_leads(etcd: EtcdServer) -> None:
    keys = Keys(f"/tsup/test-{uuid.uuid4().hex[:8]}")
    direct = EtcdClient([etcd.endpoint])
    lease = direct.grant(30).id
    for n in ("a", "c"):  # a leads; c is another node
        direct.put(keys.node(n), NodeRecord(n, "127.0.0.1", Phase.RUNNING, 1).to_json(), lease=lease)
    direct.put(keys.leader, "a", lease=lease)
    now = [0.0]  # the agent's clock; its turns are driven here, one at a time
    b = ClusterAgent(EtcdClient([etcd.endpoint]), keys, "b", "127.0.0.1",
                     Rules(nodes=3, min_nodes=3, wait_for_nodes_s=60.0, lease_ttl_s=10.0),
                     on_stop=lambda r: None, on_event=lambda *a: None, clock=lambda: now[0])
    mirror = b.mirror
    assert mirror is not None

    def copy() -> list[str] | None:
        snap = mirror.snapshot()
        return None if snap is None or snap[0] == OPENING else [kv.key for kv in snap[1]]

    def turn_when(cond: Callable[[list[str]], bool], what: str) -> None:
        wait_for(lambda: (k := copy()) is not None and cond(k), timeout=10, what=what)
        b._turn()

    mirror.start()
    try:
        turn_when(lambda k: keys.leader in k, "the first full read")  # every key until a leader is known
        assert b.view.leader == "a" and set(b.view.nodes) >= {"a", "c"} and b._following()
        turn_when(lambda k: keys.node("c") not in k, "the follower's ranges open")
        assert b.view.leader == "a" and set(b.view.nodes) == {"a"}  # the leader's record, read for the trust check
        direct.put(keys.node("d"), NodeRecord("d", "127.0.0.1", Phase.RUNNING, 1).to_json(), lease=lease)
        direct.put(keys.plan, Plan(1, ("a", "c", "d"), None, "a", "127.0.0.1", "first", lease=lease).to_json())
        turn_when(lambda k: keys.plan in k, "the plan through the watch")
        assert b.view.plan is not None and b.view.plan.gen == 1 and "d" not in b.view.nodes
        assert not any(k.startswith(keys.nodes) for k in copy() or [])  # no record reaches a follower's copy
        assert set(b.status()["nodes"]) == {"a"}  # the daemon's loop asks each tick: no read
        b._read_records()  # what b's thread does when a person's `status` asks (status(wait_s=...))
        assert set(b.status()["nodes"]) == {"a", "b", "c", "d"}
        direct.delete(keys.leader)  # the leader is gone; b is elected (its key on its lease)
        turn_when(lambda k: keys.leader not in k, "the leader key's deletion")
        assert b.view.leader is None and direct.put(keys.leader, "b", lease=b.lease or 0)
        turn_when(lambda k: keys.leader in k, "b's leader key")
        assert b.view.leader == "b" and not b._following()  # leading: every key first, no step on the follower's copy
        turn_when(lambda k: keys.node("d") in k, "every record read")
        assert b.view.leader == "b" and set(b.view.nodes) >= {"a", "b", "c", "d"}
    finally:
        b.close()
