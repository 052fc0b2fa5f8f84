"""What a node says when the waiting nodes' launches differ (digest.py compares them): every
waiting node logs the difference once (``cluster_launch_mismatch``), and again when they agree.
The leader, which watches the digests, works it out and writes it to ``P/mismatch`` on its
lease; a follower, which does not watch them (with N nodes that would be 2 N writes a fault to
every node), says what the leader's note says when it names it (trust.py believes the note only
on the leader's lease)."""

from __future__ import annotations

from typing import Callable, Mapping

import structlog

from ..levels import Level
from .digest import Mismatch, mismatch
from .etcd import EtcdClient, same
from .etcdtypes import EtcdError
from .runkeys import Keys, Phase, View

log = structlog.get_logger("supervisor.cluster")

Emit = Callable[..., None]  # (event, level, message, **data): the agent's events


class LaunchReport:
    def __init__(self, client: EtcdClient, keys: Keys, node_id: str, wait_for_nodes_s: float, emit: Emit) -> None:
        self.client = client
        self.keys = keys
        self.node_id = node_id
        self.wait_for_nodes_s = wait_for_nodes_s
        self.emit = emit
        self.said = ""  # the difference last reported here
        self.sent: Mismatch | None = None  # the leader's note as last written

    def share(self, view: View, lease: int) -> None:
        """The leader (watching every key): write what differs for the followers, delete the note
        once the launches agree. A failed write is retried at the next call."""
        waiting = _waiting(view)
        differ = mismatch(waiting) if len(waiting) >= 2 else ""
        note = Mismatch(differ, tuple(sorted(waiting))) if differ else None
        if note == self.sent:
            return
        try:
            if note is not None:  # lands only while the leader key is on this node's lease
                self.client.put_if(self.keys.mismatch, note.to_json(), [same(self.keys.leader, "LEASE", lease)],
                                   lease=lease)
            else:
                self.client.delete(self.keys.mismatch)
        except EtcdError as e:
            log.warning("cluster_command_failed", command="share_mismatch", error=str(e),
                        message="retried at the next turn")
            return
        self.sent = note

    def report(self, view: View, following: bool, waiting_here: bool) -> None:
        """Say what differs, once per difference: from the digests where this node watches them,
        else from the leader's note when it names this node (and this node waits)."""
        if following:
            note = view.mismatch
            named = waiting_here and note is not None and self.node_id in note.nodes
            differ, nodes = (note.text, list(note.nodes)) if named and note is not None else ("", [self.node_id])
        else:
            waiting = _waiting(view)
            if self.node_id not in waiting or len(waiting) < 2:
                return  # nothing to compare (the others left after a give-up say nothing of agreement)
            differ, nodes = mismatch(waiting), sorted(waiting)
        if differ and differ != self.said:
            self.emit("cluster_launch_mismatch", Level.ERROR, f"{differ}; no generation starts until they agree (restart "
                      f"the odd node with the others' command, config, code and packages); after wait_for_nodes_s "
                      f"({self.wait_for_nodes_s:g} s) the run gives up", nodes=nodes)
        elif not differ and self.said:
            self.emit("cluster_launch_agreed", Level.INFO, "the waiting nodes' launches agree now")
        self.said = differ


def _waiting(view: View) -> dict[str, Mapping[str, str]]:
    return {n: d for n, d in view.digests.items() if n in view.nodes and view.nodes[n].phase is Phase.WAITING}
