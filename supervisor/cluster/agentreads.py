"""What the cluster agent reads: the watched copy of the run's keys (every key on the leader, only
the keys a follower acts on elsewhere) or, while no watch is open, the keys read from etcd each
turn; which changes wake a turn at once; a follower's read of the leader's record (once per
leader key) and of every record (for `status`). Methods of
:class:`~supervisor.cluster.agent.ClusterAgent`, apart so that agent.py keeps to the turn and the
daemon's calls.
"""

from __future__ import annotations

import threading
from typing import Mapping

from .etcd import EtcdClient
from .etcdtypes import EtcdError, KeyRange, KeyValue
from .mirror import OPENING, MirrorSet
from .runkeys import Keys, NodeRecord, View


class AgentReads:
    """The agent's reads; its state is the :class:`~supervisor.cluster.agent.ClusterAgent`'s."""

    client: EtcdClient
    keys: Keys
    mirror: MirrorSet | None
    _followed: tuple[KeyRange, ...]
    _end_prefix: str
    _records: Mapping[str, NodeRecord] | None
    _records_wanted: threading.Event
    _records_read: threading.Event
    _leader_rec: tuple[int, KeyValue] | None

    def _read_records(self) -> None:
        """For `status` on a follower: every node record, read once (not watched: see _followed)."""
        self._records_wanted.clear()
        try:
            kvs, _rev = self.client.get_prefix(self.keys.nodes)
            self._records = View.parse(self.keys, ((kv.key, kv.value, kv.mod_revision) for kv in kvs)).nodes
        except EtcdError:
            pass  # the last read shows; etcd_reachable says why
        finally:
            self._records_read.set()

    def _following(self) -> bool:
        return self.mirror is not None and self.mirror.ranges == self._followed

    def _keys(self) -> tuple[int | None, list[KeyValue]]:
        """(the watched copy's version, or None when read from etcd now; the keys); the version
        is OPENING while the watch is being opened (no keys: the turn waits for it). A follower's
        copy has no node records: the leader's is read once per leader key (the trust check
        believes a leader key only on the lease of the record of the node it names)."""
        snap = self.mirror.snapshot() if self.mirror is not None else None
        if snap is None:
            kvs, _rev = self.client.get_prefix(self.keys.all)
            return None, kvs
        version, kvs = snap
        if version == OPENING or not self._following():
            return snap
        lkv = next((kv for kv in kvs if kv.key == self.keys.leader), None)
        if lkv is None:
            return snap
        known = self._leader_rec
        if known is None or known[0] != lkv.mod_revision or known[1].lease != lkv.lease:
            rec = self.client.get(self.keys.node(lkv.value))  # read again each turn while it does not match
            if rec is None:
                return snap
            known = self._leader_rec = (lkv.mod_revision, rec)
        return version, kvs + [known[1]]

    def _urgent(self, key: str) -> bool:
        """A single write this node acts on at once (SETTLE_S): the plan, an end request, the
        leader key, the mismatch; not the keys every node writes at once (records, digests, finished,
        give-ups)."""
        return (key == self.keys.plan or key == self.keys.leader or key.startswith(self._end_prefix)
                or key == self.keys.mismatch)
