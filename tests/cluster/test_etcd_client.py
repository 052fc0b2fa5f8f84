"""The etcd client against a real etcd (tests/cluster/etcdserver.py)."""

from __future__ import annotations

import time

import pytest

from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.etcdtypes import EtcdUnavailable, LeaseExpired
from tests.cluster.etcdserver import EtcdServer, free_port
from tests.util import wait_for


def test_put_get_prefix_delete(etcd: EtcdServer) -> None:
    c = EtcdClient([etcd.endpoint])
    rev = c.put("/run/a", "1")
    c.put("/run/b", "2")
    c.put("/runx", "other")  # shares the text prefix but not the folder
    kv = c.get("/run/a")
    assert kv is not None and kv.value == "1" and kv.mod_revision == rev
    kvs, now = c.get_prefix("/run/")
    assert [k.key for k in kvs] == ["/run/a", "/run/b"] and now >= rev
    changed, _ = c.get_prefix("/run/", min_mod_revision=rev + 1)
    assert [k.key for k in changed] == ["/run/b"]  # a poll by revision sees only what changed since
    assert c.delete("/run/a") == 1 and c.get("/run/a") is None
    assert c.delete_prefix("/run/") == 1 and c.get("/runx") is not None


def test_create_is_compare_and_swap_first_wins(etcd: EtcdServer) -> None:
    a, b = EtcdClient([etcd.endpoint]), EtcdClient([etcd.endpoint])
    won, _ = a.create("/run/gen/1/end", "from a")
    lost, existing = b.create("/run/gen/1/end", "from b")
    assert won and not lost and existing is not None and existing.value == "from a"
    kv = a.get("/run/gen/1/end")
    assert kv is not None
    assert a.replace("/run/gen/1/end", "updated", kv.mod_revision)
    assert not b.replace("/run/gen/1/end", "stale", kv.mod_revision)  # the revision moved on
    got = a.get("/run/gen/1/end")
    assert got is not None and got.value == "updated"


def test_lease_keys_go_with_the_lease(etcd: EtcdServer) -> None:
    c = EtcdClient([etcd.endpoint])
    lease = c.grant(2)
    assert lease.ttl == 2
    c.put("/run/nodes/n1", "alive", lease=lease.id)
    assert c.keepalive(lease.id) == 2
    kv = c.get("/run/nodes/n1")
    assert kv is not None and kv.lease == lease.id
    c.revoke(lease.id)
    assert c.get("/run/nodes/n1") is None
    with pytest.raises(LeaseExpired):
        c.keepalive(lease.id)
    c.revoke(lease.id)  # revoking twice is fine


def test_lease_expires_without_keepalive(etcd: EtcdServer) -> None:
    c = EtcdClient([etcd.endpoint])
    lease = c.grant(1)
    c.put("/run/nodes/n2", "alive", lease=lease.id)
    t0 = time.monotonic()
    wait_for(lambda: c.get("/run/nodes/n2") is None, timeout=10, what="the leased key to expire")
    assert time.monotonic() - t0 < 8  # a 1 s lease: etcd's expiry is coarse, but not unbounded


def test_unavailable_then_failover_to_a_live_endpoint(etcd: EtcdServer) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(EtcdUnavailable):
        EtcdClient([dead], timeout_s=0.5).get("/x")
    c = EtcdClient([dead, etcd.endpoint], timeout_s=0.5)
    c.put("/x", "y")
    assert c.endpoints[c._good] == etcd.endpoint


def test_data_and_leases_survive_an_etcd_restart(etcd: EtcdServer) -> None:
    c = EtcdClient([etcd.endpoint], timeout_s=0.5)
    lease = c.grant(30)
    c.put("/run/nodes/n3", "alive", lease=lease.id)
    etcd.stop()
    with pytest.raises(EtcdUnavailable):
        c.get("/run/nodes/n3")
    etcd.start()
    kv = c.get("/run/nodes/n3")
    assert kv is not None and kv.value == "alive"
    assert c.keepalive(lease.id) == 30
