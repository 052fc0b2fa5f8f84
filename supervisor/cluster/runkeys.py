"""The run's keys in etcd: their names (:class:`Keys`), what each holds (:class:`NodeRecord`,
:class:`EndRequest`, :class:`Plan`) and the keys at one revision read as a :class:`View`. Apart
from the rules (:mod:`supervisor.cluster.coord`) because the trust check, the launch report and
the agent read and write them without deciding anything.

Keys under the run's prefix ``P``::

    P/nodes/<id>   NodeRecord    on the node's lease: membership (gone when the lease expires)
    P/leader       <id>          on the leader's lease: the election (first create wins)
    P/plan         Plan          the current generation, written by the leader on its lease (a transaction)
    P/end/<gen>    EndRequest    a request to end generation <gen> (first create wins, the rest fold);
                                 with its writer's lease: the leader's or a member's
    P/finished/<id> <gen>        the node's job finished successfully in <gen> (no lease: it stays)
    P/gave_up/<id> GaveUpNote    the node's supervisor gave up (no lease): the whole run gives up
                                 (trust.py: from a member of the current generation only)
    P/digest/<id> digest         on the node's lease while it waits: what it would launch (digest.py);
                                 the leader plans only nodes whose digests agree
    P/mismatch    Mismatch       on the leader's lease while the waiting nodes' digests differ: what
                                 differs, for the followers (which do not watch the digests)
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any, Iterable, Mapping

from ..core.causes import Action, action_named
from .digest import Mismatch, decode as decode_digest
from .etcdtypes import wire_text


class Phase(StrEnum):
    STARTING = "starting"  # registered, not ready yet (its supervisor is starting up)
    RUNNING = "running"  # the job of generation ``gen`` runs here
    WAITING = "waiting"  # no job: ready to join a generation newer than ``gen``
    GAVE_UP = "gave_up"  # this node's supervisor gave up: the run cannot go on

@dataclass(frozen=True)
class NodeRecord:
    node_id: str
    addr: str
    phase: Phase
    gen: int  # RUNNING: the generation it runs; WAITING: the newest it ran or saw
    steps: tuple[int, ...] = ()  # checkpoint steps verified on this node (WAITING)
    state: str = ""  # the local supervisor's state, for `status`
    life: str = ""  # one id per daemon start: a plan names the lives it launched

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "steps": list(self.steps)}, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> "NodeRecord":
        return _node_record(text)

    def but(self, **changes: Any) -> "NodeRecord":
        return replace(self, **changes)


@functools.lru_cache(maxsize=2048)
def _node_record(text: str) -> NodeRecord:
    """Decoded once per record value: every turn reads every node's record (twice: the view and
    the trust check), which with hundreds of nodes was most of an agent's CPU. The records are
    frozen, so sharing one is safe; 2,048 values (under 2 MB) cover the records of ~1,000 nodes."""
    d = json.loads(text)
    return NodeRecord(str(d["node_id"]), str(d.get("addr", "")), Phase(d["phase"]), int(d["gen"]),
                      tuple(int(s) for s in d.get("steps") or ()), str(d.get("state", "")), str(d.get("life", "")))


@dataclass(frozen=True)
class EndRequest:
    gen: int
    by: str  # the node that asked
    cause: str  # a Cause value: the followers stop with the same cause
    summary: str
    step: int | None = None
    onset_step: int | None = None
    #: the requesting node's policy decision; on the wire its name ("restart", "rollback", "give_up")
    action: Action = Action.RESTART
    lease: int = 0  # the writer's lease (the leader's, or the asking member's): checked on reading (trust.py)

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "summary": wire_text(self.summary)}, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> "EndRequest":
        """Raises ValueError naming the problem (an unknown action: a peer running another version)."""
        d = json.loads(text)
        return EndRequest(int(d["gen"]), str(d["by"]), str(d["cause"]), str(d.get("summary", "")),
                          d.get("step"), d.get("onset_step"), action_named(str(d.get("action") or "restart")),
                          int(d.get("lease") or 0))


@dataclass(frozen=True)
class Plan:
    gen: int
    nodes: tuple[str, ...]  # rank order: the leader first when it takes part
    step: int | None  # the checkpoint step every node resumes from (None: fresh start)
    leader: str
    master_addr: str  # rank 0's address: the rendezvous endpoint
    reason: str
    give_up: str | None = None  # the run ends: why
    lives: tuple[str, ...] = ()  # each node's daemon life when the plan was made (same order as nodes)
    lease: int = 0  # the leader's lease when it wrote the plan: checked on reading (trust.py)
    #: each member's record lease when the plan was made (same order as nodes): a follower, which
    #: does not watch the records, checks a member's end request or give-up against it (trust.py)
    leases: tuple[int, ...] = ()

    def lease_of(self, node_id: str) -> int:
        i = self.nodes.index(node_id) if node_id in self.nodes else len(self.leases)
        return self.leases[i] if i < len(self.leases) else 0

    def life_of(self, node_id: str) -> str:
        i = self.nodes.index(node_id)
        return self.lives[i] if i < len(self.lives) else ""

    def rank(self, node_id: str) -> int:
        return self.nodes.index(node_id)

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "nodes": list(self.nodes), "lives": list(self.lives),
                           "leases": list(self.leases), "reason": wire_text(self.reason),
                           "give_up": None if self.give_up is None else wire_text(self.give_up)}, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> "Plan":
        d = json.loads(text)
        return Plan(int(d["gen"]), tuple(d["nodes"]), d.get("step"), str(d["leader"]), str(d.get("master_addr", "")),
                    str(d.get("reason", "")), d.get("give_up"), tuple(d.get("lives") or ()), int(d.get("lease") or 0),
                    tuple(int(x) for x in d.get("leases") or ()))


@dataclass(frozen=True)
class Keys:
    prefix: str

    @property
    def nodes(self) -> str:
        return f"{self.prefix}/nodes/"

    def node(self, node_id: str) -> str:
        return f"{self.nodes}{node_id}"

    @property
    def leader(self) -> str:
        return f"{self.prefix}/leader"

    @property
    def plan(self) -> str:
        return f"{self.prefix}/plan"

    def end(self, gen: int) -> str:
        return f"{self.prefix}/end/{gen}"

    def finished(self, node_id: str) -> str:
        return f"{self.prefix}/finished/{node_id}"

    def gave_up(self, node_id: str) -> str:
        return f"{self.prefix}/gave_up/{node_id}"

    def digest(self, node_id: str) -> str:
        return f"{self.prefix}/digest/{node_id}"

    @property
    def mismatch(self) -> str:
        return f"{self.prefix}/mismatch"

    @property
    def all(self) -> str:
        return f"{self.prefix}/"


@dataclass(frozen=True)
class View:
    """The run's keys at one revision."""

    nodes: Mapping[str, NodeRecord] = field(default_factory=dict)
    leader: str | None = None
    plan: Plan | None = None
    plan_rev: int = 0  # the plan key's mod revision (0: none yet): the leader's compare-and-swap
    ends: Mapping[int, EndRequest] = field(default_factory=dict)
    finished: Mapping[str, int] = field(default_factory=dict)  # node -> the generation its job finished in
    gave_up: Mapping[str, str] = field(default_factory=dict)  # node -> why its supervisor gave up
    digests: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # node -> its launch digest (waiting)
    # Set by trust.Trust.check (the view a node believes):
    leader_rev: int = 0  # the leader key's mod revision (0: no leader key), believed or not
    leader_stale: bool = False  # the leader key failed the checks for a lease TTL: an election replaces it
    end_revs: Mapping[int, int] = field(default_factory=dict)  # generation -> its end key's mod revision
    floor_gen: int = 0  # the plan key's generation, believed or not: the next plan goes past it
    node_leases: Mapping[str, int] = field(default_factory=dict)  # node -> its record's lease (believed records)
    mismatch: Mismatch | None = None  # the leader's word on the waiting nodes' launches (believed only on its lease)

    @staticmethod
    def parse(keys: Keys, kvs: Iterable[tuple[str, str, int]]) -> "View":
        """From (key, value, mod_revision) triples; a key that does not parse is skipped (a
        newer supervisor's record must not stop an older one)."""
        nodes: dict[str, NodeRecord] = {}
        ends: dict[int, EndRequest] = {}
        finished: dict[str, int] = {}
        gave_up: dict[str, str] = {}
        digests: dict[str, dict[str, str]] = {}
        leader, plan, plan_rev, differ = None, None, 0, None
        # The names once, not per key: a view is rebuilt from every key after each change.
        node_p, leader_k, plan_k, mismatch_k = keys.nodes, keys.leader, keys.plan, keys.mismatch
        end_p, finished_p, gave_up_p, digest_p = (f"{keys.prefix}/{d}/" for d in ("end", "finished", "gave_up", "digest"))
        for key, value, rev in kvs:
            try:
                if key.startswith(node_p):
                    rec = _node_record(value)
                    nodes[rec.node_id] = rec
                elif key == leader_k:
                    leader = value
                elif key == plan_k:
                    plan, plan_rev = Plan.from_json(value), rev
                elif key.startswith(end_p):
                    req = EndRequest.from_json(value)
                    ends[req.gen] = req
                elif key.startswith(finished_p):
                    finished[key.rsplit("/", 1)[1]] = int(value)
                elif key.startswith(gave_up_p):
                    gave_up[key.rsplit("/", 1)[1]] = value
                elif key.startswith(digest_p):
                    digests[key.rsplit("/", 1)[1]] = decode_digest(value)
                elif key == mismatch_k:
                    differ = Mismatch.from_json(value)
            except (ValueError, KeyError, TypeError):
                continue
        return View(nodes, leader, plan, plan_rev, ends, finished, gave_up, digests=digests, mismatch=differ)
