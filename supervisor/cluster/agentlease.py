"""This node's own keys, kept by the cluster agent at the start of each turn: its lease (kept
alive, granted again when it expired) and its record, with its launch digest while it waits.
Methods of :class:`~supervisor.cluster.agent.ClusterAgent`, apart so that agent.py keeps to the
turn and the daemon's calls.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Mapping

from ..levels import Level
from .coord import Rules
from .digest import encode as encode_digest
from .etcd import EtcdClient
from .etcdtypes import LeaseExpired
from .runkeys import Keys, NodeRecord, Phase

KEEPALIVE_EVERY = 0.25  # of the TTL: three tries fail before the fence (2/3 TTL) and the expiry


class AgentLease:
    """The agent's lease and record; its state is the :class:`~supervisor.cluster.agent.ClusterAgent`'s."""

    client: EtcdClient
    keys: Keys
    node_id: str
    rules: Rules
    me: NodeRecord
    lease: int | None
    last_ok: float
    _cond: threading.Condition
    _keepalive_at: float
    _published: NodeRecord | None
    _digest: Mapping[str, str] | None
    _digest_sent: Mapping[str, str] | None

    if TYPE_CHECKING:
        def _emit(self, event: str, level: Level, message: str, **data: Any) -> None: ...

    def _keep_lease(self, now: float) -> None:
        if self.lease is not None and now >= self._keepalive_at:
            try:
                self.client.keepalive(self.lease)
            except LeaseExpired:
                self._emit("cluster_lease_lost", Level.WARNING, "this node's lease expired (etcd was out of reach "
                           "longer than its TTL); registering again")
                self.lease, self._published = None, None
            else:
                self.last_ok = now
                self._keepalive_at = now + KEEPALIVE_EVERY * self.rules.lease_ttl_s
        if self.lease is None:
            self.lease = self.client.grant(max(1, round(self.rules.lease_ttl_s))).id
            self.last_ok = now
            self._keepalive_at = now + KEEPALIVE_EVERY * self.rules.lease_ttl_s
            self._published = None

    def _publish(self) -> None:
        with self._cond:
            me, digest = self.me, self._digest
        waiting = me.phase is Phase.WAITING and digest is not None
        if waiting and (self._published is None or digest != self._digest_sent):  # before the record says ready
            self.client.put(self.keys.digest(self.node_id), encode_digest(digest or {}), lease=self.lease or 0)
            self._digest_sent = digest
        elif not waiting and self._digest_sent is not None:  # only a barrier needs it: none at rest
            self.client.delete(self.keys.digest(self.node_id))
            self._digest_sent = None
        if me != self._published:
            assert self.lease is not None
            self.client.put(self.keys.node(self.node_id), me.to_json(), lease=self.lease)
            self._published = me
