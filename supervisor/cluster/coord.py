"""The coordination rules of a multi-node run, without I/O or clock reads: a view of the run's
keys in etcd and this node's own state in, the commands to carry out (through etcd or on the
local job) out. :mod:`supervisor.cluster.agent` reads the keys, calls :meth:`Coordinator.step`
and carries the commands out; the tests drive it with scripted views.

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

A generation is one launch of the job on a set of nodes. Any node's failure (or the leader seeing
a member's lease gone: ``node_lost``) ends it; every member stops its job and says so (``waiting``,
with the checkpoint steps it verified); the leader then writes the next plan: the nodes, each one's
rank, the newest step verified on every one of them (before the onset for a rollback), or a give-up
when fewer than ``min_nodes`` came back within ``wait_for_nodes_s``. Only the plan in etcd starts a
generation, so two can never run at once. Only the leader's plans count (:mod:`.trust` checks
every key against the leases). A node cut off from etcd keeps a healthy job until a generation
without it could start (:meth:`Coordinator.fence_after`), then stops it (fencing).
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any, Iterable, Mapping

from ..core.causes import ACTIONS, Action, action_named
from .digest import Mismatch, decode as decode_digest, mismatch

NODE_LOST = "node_lost"
FENCE_AFTER = 2 / 3  # of the lease TTL without a keepalive: the job stops before the lease can expire


class Phase(StrEnum):
    STARTING = "starting"  # registered, not ready yet (its supervisor is starting up)
    RUNNING = "running"  # the job of generation ``gen`` runs here
    WAITING = "waiting"  # no job: ready to join a generation newer than ``gen``
    GAVE_UP = "gave_up"  # this node's supervisor gave up: the run cannot go on


@dataclass(frozen=True)
class Rules:
    nodes: int  # the generation starts at once when this many are ready
    min_nodes: int  # fewer than this after wait_for_nodes_s: give up
    wait_for_nodes_s: float
    lease_ttl_s: float


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
        return json.dumps(asdict(self), sort_keys=True)

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
                           "leases": list(self.leases)}, sort_keys=True)

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


# ---------------------------------------------------------------------- commands
@dataclass(frozen=True)
class Campaign:
    """No leader: try to become it (create the leader key on our lease, or replace a stale one
    still at ``expect_rev``)."""

    expect_rev: int = 0


@dataclass(frozen=True)
class RequestEnd:
    """Ask to end a generation (create its end key; an existing one wins unless it is not
    believed: the leader replaces it while it is still at ``expect_rev``)."""

    request: EndRequest
    expect_rev: int = 0


@dataclass(frozen=True)
class StopLocal:
    """Stop the local job: its generation ended (the request says who asked and why)."""

    request: EndRequest


@dataclass(frozen=True)
class WritePlan:
    """The leader's next generation (compare-and-swap on ``expect_rev``)."""

    plan: Plan
    expect_rev: int


@dataclass(frozen=True)
class Join:
    """Launch the job as ``rank`` of the plan's generation."""

    plan: Plan
    rank: int


@dataclass(frozen=True)
class GiveUp:
    reason: str


Command = Campaign | RequestEnd | StopLocal | WritePlan | Join | GiveUp


def choose_step(records: Iterable[NodeRecord], action: Action, onset_step: int | None) -> int | None:
    """The newest checkpoint step verified on every node (before the onset for a rollback);
    None when they share none."""
    common: set[int] | None = None
    for r in records:
        common = set(r.steps) if common is None else common & set(r.steps)
    if not common:
        return None
    if ACTIONS[action].before_onset and onset_step is not None:
        common = {s for s in common if s < onset_step}
    return max(common) if common else None


class Coordinator:
    """One node's coordination: :meth:`step` with the current view, this node's own record and
    the monotonic time; the commands to carry out. Keeps only what the view cannot say: when
    the leader began waiting for nodes, and which generation it already stopped for."""

    def __init__(self, node_id: str, rules: Rules) -> None:
        self.node_id = node_id
        self.rules = rules
        self.waiting_since: float | None = None  # leader: when the current barrier began
        self.stopped_for = 0  # the newest generation a StopLocal was issued for
        self.joined = 0  # the newest generation a Join was issued for
        # When this node last (re)gained contact with etcd: after an outage every daemon re-registers
        # (leases that expired meanwhile are granted anew), so a missing record means a lost node
        # only a TTL later (set by the agent).
        self.contact_since = float("-inf")

    def step(self, view: View, me: NodeRecord, now: float) -> list[Command]:
        out: list[Command] = []
        if view.leader is None and (view.leader_rev == 0 or view.leader_stale):
            out.append(Campaign(view.leader_rev))
        out += self._follow(view, me)
        if view.leader == self.node_id:
            out += self._lead(view, now)
        else:
            self.waiting_since = None
        return out

    def fence_after(self) -> float:
        """How long a node cut off from etcd keeps its job. No new generation can be planned
        without etcd's quorum, and the earliest one without this node starts after its lease
        expired (at least a TTL after its last keepalive) and the leader then waited
        ``wait_for_nodes_s`` for it (:meth:`_next_plan` never starts early while a member is
        missing): so the job stops a third of a TTL before that can happen (fencing), not before."""
        return FENCE_AFTER * self.rules.lease_ttl_s + self.rules.wait_for_nodes_s

    def lost_contact(self, me: NodeRecord, last_ok: float, now: float) -> list[Command]:
        """Cut off from etcd since ``last_ok`` (the last keepalive etcd answered): a healthy job
        keeps running until a generation without this node could start (:meth:`fence_after`)."""
        if me.phase is Phase.RUNNING and now - last_ok >= self.fence_after() and self.stopped_for < me.gen:
            self.stopped_for = me.gen
            return [StopLocal(EndRequest(me.gen, self.node_id, NODE_LOST,
                                         f"node {self.node_id} lost contact with etcd for {now - last_ok:.1f} s "
                                         f"(lease TTL {self.rules.lease_ttl_s:g} s + wait_for_nodes_s "
                                         f"{self.rules.wait_for_nodes_s:g} s): the others may go on without it"))]
        return []

    # ------------------------------------------------------------------ every node
    def _follow(self, view: View, me: NodeRecord) -> list[Command]:
        plan = view.plan
        if me.phase is Phase.RUNNING:
            g = me.gen
            if g in view.ends and self.stopped_for < g:
                self.stopped_for = g
                return [StopLocal(view.ends[g])]
            if plan is not None and plan.gen > g and self.stopped_for < g:
                self.stopped_for = g  # the run moved on without us (a partition healed): stop, join the next
                return [StopLocal(EndRequest(g, self.node_id, NODE_LOST, f"generation {plan.gen} started without "
                                             f"node {self.node_id}, which was still running generation {g}"))]
            return []
        if me.phase is Phase.WAITING and plan is not None and plan.gen > me.gen and plan.gen > self.joined:
            if plan.give_up:
                self.joined = plan.gen
                return [GiveUp(plan.give_up)]
            if self.node_id in plan.nodes:
                self.joined = plan.gen
                if plan.lives and plan.life_of(self.node_id) != me.life:
                    return []  # made for this node's previous daemon: it joins the next generation
                return [Join(plan, plan.rank(self.node_id))]
        return []

    # ------------------------------------------------------------------ the leader
    def _lead(self, view: View, now: float) -> list[Command]:
        plan = view.plan
        if plan is not None and plan.give_up:
            return []
        g = plan.gen if plan is not None else 0
        if view.gave_up and g not in view.ends:
            who = sorted(view.gave_up)[0]
            return [RequestEnd(EndRequest(g, who, "gave_up", view.gave_up[who], action=Action.GIVE_UP),
                               view.end_revs.get(g, 0))]
        if plan is not None and g not in view.ends:
            lost = self._lost_members(view, plan, now)
            if lost:
                return [RequestEnd(EndRequest(g, self.node_id, NODE_LOST, lost), view.end_revs.get(g, 0))]
            return []
        if plan is not None:
            running = [n for n in plan.nodes if n in view.nodes and not self._stopped(view.nodes[n], g)
                       and view.finished.get(n, 0) < g]
            if running:
                return []  # every member still alive stops first: never two generations at once
        return self._next_plan(view, g, now)

    def _lost_members(self, view: View, plan: Plan, now: float) -> str:
        done = {n for n, g in view.finished.items() if g >= plan.gen}  # finished nodes are not lost
        gone = [n for n in plan.nodes if n not in view.nodes and n not in done]
        if gone and now - self.contact_since >= self.rules.lease_ttl_s:
            return f"node {', '.join(gone)} lost: its lease expired (daemon killed, node down or cut off)"
        back = [n for n in plan.nodes if n not in done and n in view.nodes and (
            (plan.lives and view.nodes[n].life != plan.life_of(n))  # its daemon restarted: its job is gone
            or (view.nodes[n].phase in (Phase.WAITING, Phase.GAVE_UP) and view.nodes[n].gen >= plan.gen))]
        if back:
            return f"node {', '.join(back)} is no longer running generation {plan.gen} (its supervisor restarted)"
        return ""

    @staticmethod
    def _stopped(rec: NodeRecord, g: int) -> bool:
        return rec.phase is Phase.GAVE_UP or (rec.phase is Phase.WAITING and rec.gen >= g)

    def _next_plan(self, view: View, g: int, now: float) -> list[Command]:
        end = view.ends.get(g)
        rules = self.rules
        gave_up = sorted({n for n, r in view.nodes.items() if r.phase is Phase.GAVE_UP} | set(view.gave_up))
        if gave_up or (end is not None and not ACTIONS[end.action].relaunches):  # the node's decision ends the run
            why = (f"node {', '.join(gave_up)} gave up" if gave_up else
                   f"node {end.by} gave up after {end.cause}: {end.summary}")  # type: ignore[union-attr]
            return [self._write(view, g, (), None, why, give_up=f"the cluster gives up: {why}")]
        # Every waiting node, a late one too (its gen is older: it missed generations, it joins this one).
        ready = sorted(n for n, r in view.nodes.items() if r.phase is Phase.WAITING)
        if self.waiting_since is None:
            self.waiting_since = now
        waited = now - self.waiting_since
        # A member gone (its lease expired) may still run its job cut off from etcd: never start
        # early without it (the rule its fence counts on, fence_after).
        missing = view.plan is not None and any(n not in view.nodes and view.finished.get(n, 0) < g
                                                for n in view.plan.nodes)
        if (len(ready) < rules.nodes or missing) and waited < rules.wait_for_nodes_s:
            return []
        if len(ready) < rules.min_nodes:
            why = (f"only {len(ready)} of {rules.nodes} nodes ready ({', '.join(ready) or 'none'}) after "
                   f"{waited:.0f} s; min_nodes = {rules.min_nodes}")
            return [self._write(view, g, (), None, why, give_up=f"the cluster gives up: {why}")]
        chosen = ready[: rules.nodes]
        differ = mismatch({n: view.digests[n] for n in chosen if n in view.digests})
        if differ:  # same code, same config: a node restarted with the others' launch may still come
            if waited < rules.wait_for_nodes_s:
                return []
            return [self._write(view, g, (), None, differ, give_up=f"the cluster gives up: {differ}")]
        if self.node_id in chosen:  # the leader is rank 0: its address is the rendezvous endpoint
            chosen = [self.node_id] + [n for n in chosen if n != self.node_id]
        action = end.action if end is not None else Action.RESTART
        step = choose_step((view.nodes[n] for n in chosen), action, end.onset_step if end else None)
        after = f"after {end.cause} on {end.by}" if end is not None else "first generation"
        why = (f"generation {max(g, view.floor_gen) + 1} on {len(chosen)} node(s) ({after}); "
               + (f"resuming from step {step}, verified on every node" if step is not None
                  else "no checkpoint step verified on every node: fresh start"))
        return [self._write(view, g, tuple(chosen), step, why)]

    def _write(self, view: View, g: int, nodes: tuple[str, ...], step: int | None, reason: str,
               give_up: str | None = None) -> WritePlan:
        self.waiting_since = None
        addr = view.nodes[nodes[0]].addr if nodes and nodes[0] in view.nodes else ""
        lives = tuple(view.nodes[n].life for n in nodes if n in view.nodes)
        leases = tuple(view.node_leases.get(n, 0) for n in nodes)
        gen = max(g, view.floor_gen) + 1  # past a plan not believed (a lost leader's last): never two of one number
        return WritePlan(Plan(gen, nodes, step, self.node_id, addr, reason, give_up, lives, leases=leases),
                         view.plan_rev)
