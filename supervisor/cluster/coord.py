"""The coordination rules of a multi-node run, without I/O or clock reads: a view of the run's
keys in etcd and this node's own state in, the commands to carry out (through etcd or on the
local job) out. :mod:`supervisor.cluster.agent` reads the keys, calls :meth:`Coordinator.step`
and carries the commands out; the tests drive it with scripted views.

The keys and what each holds: :mod:`supervisor.cluster.runkeys`.

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

from dataclasses import dataclass
from typing import Iterable

from ..core.causes import ACTIONS, Action
from .digest import mismatch
from .runkeys import EndRequest, NodeRecord, Phase, Plan, View

NODE_LOST = "node_lost"
FENCE_AFTER = 2 / 3  # of the lease TTL without a keepalive: the job stops before the lease can expire


@dataclass(frozen=True)
class Rules:
    nodes: int  # the generation starts at once when this many are ready
    min_nodes: int  # fewer than this after wait_for_nodes_s: give up
    wait_for_nodes_s: float
    lease_ttl_s: float


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
class Abandon:
    """Give the run up on every node (the plan's ``give_up`` reason); the daemon then raises ``GiveUp``."""

    reason: str


Command = Campaign | RequestEnd | StopLocal | WritePlan | Join | Abandon


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
                return [Abandon(plan.give_up)]
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
