"""One node's link to the run's keys in etcd: a thread that keeps this node's lease and record,
follows the keys (etcd's watches keep a copy, :class:`~supervisor.cluster.mirror.MirrorSet`: every
key on the leader, only the keys a follower acts on elsewhere; the keys are read every turn
while a watch is not open), hands the view to the pure
:class:`~supervisor.cluster.coord.Coordinator` and carries out what it says. A turn runs when the
copy changes and every ``poll_s`` (the coordinator's timeouts, this node's own record); at rest it
sends etcd nothing but the lease keepalives.

The daemon sees three calls: :meth:`ClusterAgent.request_end` (a local failure ends the
generation), :meth:`ClusterAgent.wait_for_generation` (the launch barrier, on the launch
preparation thread: publish this node's verified steps, block until the leader's plan includes
it or the run gives up) and :meth:`ClusterAgent.finished`; ``on_stop`` tells it when another
node's failure (or losing etcd past the fence, :meth:`Coordinator.fence_after`) means the local
job must stop.

When etcd cannot be reached, local supervision goes on and nothing is decided blind; the lease is
re-granted and the node re-registered when etcd answers again.

What a turn reads: :mod:`supervisor.cluster.agentreads`; this node's lease and record:
:mod:`supervisor.cluster.agentlease`.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import replace
from typing import Any, Callable, Mapping

import structlog

from ..core.causes import Cause, action_named
from ..errors import GiveUp, SupervisorError
from ..levels import Level
from ..logsite import log_helper
from .agentlease import AgentLease
from .agentreads import AgentReads
from .coord import Abandon, Campaign, Command, Coordinator, Join, RequestEnd, Rules, StopLocal, WritePlan
from .etcd import EtcdClient, same
from .etcdtypes import EtcdError, EtcdUnavailable, KeyRange, KeyValue
from .launchreport import LaunchReport
from .mirror import OPENING, MirrorSet
from .runkeys import EndRequest, Keys, NodeRecord, Phase, Plan, View
from .trust import GaveUpNote, Trust

log = structlog.get_logger("supervisor.cluster")

POLL_S = 0.2  # a turn at least this often (timeouts, this node's record); the keys are read at each
# only while the watch is not open: a remote failure then reaches this node within about this
SETTLE_S = 0.02  # after a change, wait this long for the rest of its burst before a turn (not after an
# urgent one, a single write: the plan, an end request, the leader key)


class ClusterGaveUp(GiveUp):
    """Raised by the launch barrier when the run gives up (fewer than min_nodes came back, or a
    node gave up); the daemon then gives up too (exit 3), booked as ``node_lost``."""

    def __init__(self, message: str, cause: Cause = Cause.NODE_LOST) -> None:
        super().__init__(message, cause)


class ClusterClosed(SupervisorError):
    """Raised by the launch barrier when the agent was closed while waiting."""

    code = "closed"


EventSink = Callable[[str, Level, str, Mapping[str, Any]], None]


class ClusterAgent(AgentReads, AgentLease):
    def __init__(self, client: EtcdClient, keys: Keys, node_id: str, addr: str, rules: Rules, *,
                 on_stop: Callable[[EndRequest], None], on_event: EventSink,
                 clock: Callable[[], float] = time.monotonic, poll_s: float = POLL_S, watch: bool = True) -> None:
        self.client = client
        self.keys = keys
        self.node_id = node_id
        self.addr = addr
        self.rules = rules
        self.on_stop = on_stop
        self.on_event = on_event
        self.clock = clock
        self.poll_s = poll_s
        self.coord = Coordinator(node_id, rules)
        self.trust = Trust(rules.lease_ttl_s)  # which keys this node believes
        self.me = NodeRecord(node_id, addr, Phase.STARTING, 0, life=uuid.uuid4().hex[:12])
        self.view = View()
        self.plan: Plan | None = None  # the generation this node runs (or last ran)
        self.lease: int | None = None
        self.last_ok = clock()  # the last keepalive etcd answered: the fence counts from it
        self._keepalive_at = 0.0
        self._published: NodeRecord | None = None
        self._digest: Mapping[str, str] | None = None  # what this node would launch (published while waiting)
        self._digest_sent: Mapping[str, str] | None = None
        self.launches = LaunchReport(client, keys, node_id, rules.wait_for_nodes_s, self._emit)  # differing launches
        self._reachable = True
        self._cond = threading.Condition()
        self._outcome: Join | Abandon | None = None
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        self._end_thread: threading.Thread | None = None
        self._wake = threading.Event()  # the watched copy or this node's record changed: a turn soon
        self._now = threading.Event()  # an urgent change (SETTLE_S): the turn without waiting for a burst to settle
        self._turn_s = 0.0  # how long the last turn took
        self._end_prefix = f"{keys.prefix}/end/"
        # Every key until a leader is known and while leading; a follower watches only what it acts on
        # (_FOLLOWED). Each watch is re-opened when silent for a TTL: an outage or refused credentials
        # show within one, as polled.
        p = keys.prefix
        self._all = (KeyRange.under(keys.all),)
        self._followed = (KeyRange(f"{p}/end/", f"{p}/nodes/".encode()), KeyRange.only(keys.plan))
        self.mirror = MirrorSet(client, self._all, self._wake.set, idle_s=rules.lease_ttl_s, urgent=self._urgent,
                                on_urgent=self._now.set) if watch else None
        self._seen: int | None = None  # the copy's version the view was last built from
        self._records: Mapping[str, NodeRecord] | None = None  # a follower's last read of every record (status)
        self._records_wanted = threading.Event()
        self._records_read = threading.Event()
        self._leader_rec: tuple[int, KeyValue] | None = None  # a follower's read of the leader's record, by leader key revision

    # ------------------------------------------------------------------ life
    def start(self) -> None:
        if self.mirror is not None:
            self.mirror.start()
        self._thread = threading.Thread(target=self._run, name="cluster-agent", daemon=True)
        self._thread.start()

    def close(self, gave_up: str | None = None) -> None:
        """Stop the thread and leave the run: a node that gave up says so first (the others then
        give up too); the lease is revoked so the others see this node gone at once."""
        self._closing.set()
        self._now.set()
        self._wake.set()
        with self._cond:
            self._cond.notify_all()
        if self.mirror is not None:
            self.mirror.close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            if gave_up is not None:  # the generation and lease let the others check it came from a member
                with self._cond:
                    gen = self.me.gen
                self.client.put(self.keys.gave_up(self.node_id), GaveUpNote(gave_up, gen, self.lease or 0).to_json())
            if self.lease is not None:
                self.client.revoke(self.lease)
        except EtcdError as e:
            log.warning("cluster_leave_failed", error=str(e), message="could not leave the run cleanly; "
                        "the others see this node gone when its lease expires")

    # ------------------------------------------------------------------ the daemon's calls
    def request_end(self, cause: str, summary: str, step: int | None, onset_step: int | None, action: str) -> None:
        """A local failure: ask to end the generation this node runs (the first request wins;
        a later one folds into it). Without etcd the request is not made: the job is stopped
        locally, and the others see this node as lost when its lease expires."""
        with self._cond:
            if self.me.phase is not Phase.RUNNING:
                return
            gen = self.me.gen
            self.coord.stopped_for = max(self.coord.stopped_for, gen)  # our own stop is under way
        req = EndRequest(gen, self.node_id, cause, summary, step, onset_step, action_named(action), self.lease or 0)
        # Sent from a thread of its own: the caller is the daemon's main loop, which must not wait
        # on etcd (a request can take request_timeout_s per endpoint when etcd is away).
        self._end_thread = threading.Thread(target=self._send_end, args=(req,), name="cluster-end-request",
                                            daemon=True)
        self._end_thread.start()

    def _send_end(self, req: EndRequest) -> None:
        gen, cause, summary = req.gen, req.cause, req.summary
        key = self.keys.end(gen)
        try:  # lands only while this node's record is on the lease the request names (a member's, checked on reading)
            won = self.client.put_if(key, req.to_json(), [same(key, "MOD", 0),
                                                          same(self.keys.node(self.node_id), "LEASE", req.lease)])
            existing = None if won else self.client.get(key)
        except EtcdError as e:
            self._emit("cluster_end_request_failed", Level.WARNING, f"could not ask the cluster to end generation "
                       f"{gen} ({e}); the job stops here, and the others notice when this node's lease expires")
            return
        if won:
            self._emit("cluster_generation_end_requested", Level.WARNING, f"asked the cluster to end generation "
                       f"{gen}: {cause} here ({summary}); every node stops its job", **req.__dict__)
        elif existing is not None:
            self._emit("cluster_generation_end_folded", Level.INFO, f"generation {gen} is already ending "
                       f"({existing.value[:200]}); this node's {cause} folds into it", cause=cause)
        else:  # our record is not on the lease the request names (re-registering): it would not count
            self._emit("cluster_end_request_failed", Level.WARNING, f"could not ask the cluster to end generation "
                       f"{gen}: this node is registering again; the job stops here, and the leader ends the "
                       "generation when this node's record says it stopped")

    def wait_for_generation(self, steps: list[int], state: str = "waiting",
                            digest: Mapping[str, str] | None = None) -> Plan:
        """The launch barrier: this node is ready (its job is stopped) with ``steps`` verified and
        ``digest`` (what it would launch: the leader plans only nodes that agree); block until the
        leader's plan includes it. Raises :class:`ClusterGaveUp` or :class:`ClusterClosed`."""
        sending = self._end_thread
        if sending is not None:  # our end request goes first: ready before it would read as a lost node
            sending.join(timeout=len(self.client.endpoints) * self.client.timeout_s + 1)
        with self._cond:
            gen = max(self.me.gen, self.coord.joined)
            self._digest = dict(digest) if digest is not None else None
            self.me = self.me.but(phase=Phase.WAITING, gen=gen, steps=tuple(sorted(set(steps))), state=state)
            self._outcome = None
            self._cond.notify_all()
            self._now.set()  # publish "ready" now, not at the next tick or after a burst settles
            self._wake.set()
            while self._outcome is None and not self._closing.is_set():
                self._cond.wait(timeout=1.0)
            outcome = self._outcome
        if isinstance(outcome, Abandon):
            raise ClusterGaveUp(outcome.reason)
        if not isinstance(outcome, Join):
            raise ClusterClosed("the cluster agent closed while waiting for a generation")
        return outcome.plan

    def finished(self) -> None:
        """The job finished successfully in this generation: not a lost node when it leaves."""
        with self._cond:
            gen = self.me.gen
        try:
            self.client.put(self.keys.finished(self.node_id), str(gen))
        except EtcdError as e:
            log.warning("cluster_finish_unrecorded", error=str(e))

    def set_state(self, state: str) -> None:
        """The local supervisor's state, shown by `status` on every node."""
        with self._cond:
            if self.me.state != state:
                self.me = self.me.but(state=state)

    def status(self, wait_s: float = 0.0) -> dict[str, Any]:
        """What `status` shows. A follower does not watch the node records: with ``wait_s`` (a
        person's `status`) its thread reads them at once and this waits up to that long for the
        read; without, the last read shows (no I/O here: the daemon's loop calls it each tick)."""
        v, plan = self.view, self.plan
        if self._following():
            if wait_s > 0:
                self._records_read.clear()
                self._records_wanted.set()
                self._now.set()
                self._wake.set()
                self._records_read.wait(wait_s)
            if self._records is not None:  # else the view's (the leader's record); etcd_reachable says the rest
                v = replace(v, nodes=self._records)
        return {"node_id": self.node_id, "leader": v.leader, "etcd_reachable": self._reachable,
                "generation": plan.gen if plan else None, "rank": plan.rank(self.node_id) if plan and
                self.node_id in plan.nodes else None,
                "nodes": {n: {"phase": r.phase.value, "gen": r.gen, "state": r.state, "addr": r.addr}
                          for n, r in sorted(v.nodes.items())}}

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        while not self._closing.is_set():
            began = time.perf_counter()
            try:
                self._turn()
            except Exception as e:  # the agent must outlive its own bugs; supervision goes on
                log.exception("cluster_agent_failed", error=repr(e), message="internal error in the cluster "
                              "agent; it keeps going")
            self._turn_s = time.perf_counter() - began
            if self._records_wanted.is_set():
                self._read_records()
            if self._wake.wait(self.poll_s):  # changes come in bursts (every node's record): one turn for a
                self._now.wait(min(max(SETTLE_S, 2 * self._turn_s), self.poll_s))  # burst; turns <= 1/3 of the time
            self._wake.clear()  # (a change from here on wakes the next turn; one before is seen by this one)
            self._now.clear()

    def _turn(self) -> None:
        now = self.clock()
        try:
            self._keep_lease(now)
            self._publish()
            version, kvs = self._keys()
            if version == OPENING:
                return
        except EtcdUnavailable as e:
            if self._reachable:
                self._reachable = False
                self._emit("cluster_etcd_unreachable", Level.WARNING, f"etcd does not answer ({e}); local supervision "
                           "goes on and no new generation can be planned without etcd; a running job stops only "
                           f"{self.coord.fence_after():.1f} s after the last keepalive, before a generation without "
                           "this node could start")
            with self._cond:
                cmds: list[Command] = list(self.coord.lost_contact(self.me, self.last_ok, now))
            self._carry_out(cmds)
            return
        if not self._reachable or self.coord.contact_since == float("-inf"):
            self.coord.contact_since = now  # members get a TTL to register again before one is lost
        if not self._reachable:
            self._reachable = True
            if self.mirror is not None:
                self.mirror.resync()  # its connection may be one etcd no longer serves
            self._emit("cluster_etcd_back", Level.INFO, "etcd answers again; this node is registered")
        # The same keys make the same view, unless a leader key under suspicion is timing out.
        if version is None or self.trust.bad_leader_since is not None or self._seen != version:
            self._believe(kvs, now)
            self._seen = version
        view = self.view
        if self.mirror is not None:
            # A follower watches only what it acts on: with N nodes a fault writes 2 N records (and
            # digests), each sent to every watch. The leader (and every node until one is known)
            # watches every key; a node that just became the leader reads them all before it acts.
            following = view.leader is not None and view.leader != self.node_id
            if following and not self._following():
                self.mirror.follow(self._followed)
            elif view.leader == self.node_id and self._following():
                self.mirror.follow(self._all)
                return
        with self._cond:
            if self.me.phase is Phase.STARTING and view.plan is not None and self.me.gen < view.plan.gen:
                # Started into a run under way: the running generation is not ours (a plan names the
                # daemon lives it launched, never a starting one); this node joins the next one.
                self.me = self.me.but(gen=view.plan.gen)
            me = self.me
            cmds = self.coord.step(view, me, now)
        self._carry_out(cmds)
        if view.leader == self.node_id and not self._following():
            self.launches.share(view, self.lease or 0)

    def _believe(self, kvs: list[KeyValue], now: float) -> None:
        node_p = self.keys.nodes  # the node records are read by the trust check (which believes them), once
        raw = View.parse(self.keys, ((kv.key, kv.value, kv.mod_revision) for kv in kvs if not kv.key.startswith(node_p)))
        view, ignored = self.trust.check(self.keys, kvs, raw, now)
        for why in ignored:
            self._emit("cluster_key_ignored", Level.WARNING, f"{why}; a stray or forged write (keep etcd behind TLS "
                       "client certificates or auth)")
        self.view = view
        with self._cond:
            waiting_here = self.me.phase is Phase.WAITING
        self.launches.report(view, self._following(), waiting_here)

    def _carry_out(self, cmds: list[Command]) -> None:
        for cmd in cmds:
            try:
                self._one(cmd)
            except EtcdError as e:
                log.warning("cluster_command_failed", command=type(cmd).__name__, error=str(e),
                            message="retried at the next turn")

    def _one(self, cmd: Command) -> None:
        lease = self.lease or 0
        # The leader's writes land only while the leader key is on its lease (one transaction): a
        # node that lost the lead between reading and writing writes nothing.
        leading = same(self.keys.leader, "LEASE", lease)
        if isinstance(cmd, Campaign):  # create, or replace a stale key still as it was read
            if lease and self.client.put_if(self.keys.leader, self.node_id,
                                            [same(self.keys.leader, "MOD", cmd.expect_rev)], lease=lease):
                self._emit("cluster_leader", Level.INFO, f"node {self.node_id} leads the run (membership, generations, "
                           "the checkpoint step)" + (" in place of a leader key that did not hold up (see "
                                                     "cluster_key_ignored)" if cmd.expect_rev else ""))
        elif isinstance(cmd, RequestEnd):
            req, key = replace(cmd.request, lease=lease), self.keys.end(cmd.request.gen)
            if self.client.put_if(key, req.to_json(), [same(key, "MOD", cmd.expect_rev), leading]):
                self._emit("cluster_generation_end_requested", Level.WARNING, f"ending generation {req.gen}: "
                           f"{req.summary}", **req.__dict__)
        elif isinstance(cmd, WritePlan):
            plan = replace(cmd.plan, lease=lease)
            if self.client.put_if(self.keys.plan, plan.to_json(), [same(self.keys.plan, "MOD", cmd.expect_rev), leading]):
                level = Level.CRITICAL if plan.give_up else Level.INFO
                self._emit("cluster_plan_written", level, plan.give_up or plan.reason, **_plan_data(plan))
        elif isinstance(cmd, StopLocal):
            r = cmd.request
            self._emit("cluster_generation_ended", Level.WARNING, f"generation {r.gen} ends: {r.cause} on node {r.by} "
                       f"({r.summary}); stopping the local job", **r.__dict__)
            self.on_stop(r)
        elif isinstance(cmd, Join):
            with self._cond:
                self.plan = cmd.plan
                self.me = self.me.but(phase=Phase.RUNNING, gen=cmd.plan.gen, steps=())
                self._outcome = cmd
                self._cond.notify_all()
            self._now.set()  # the record says "running" at the next turn, at once
            self._wake.set()
            self._emit("cluster_generation_joined", Level.INFO, f"joining generation {cmd.plan.gen} as rank {cmd.rank} "
                       f"of {len(cmd.plan.nodes)}: {cmd.plan.reason}", rank=cmd.rank, **_plan_data(cmd.plan))
        elif isinstance(cmd, Abandon):
            with self._cond:
                self._outcome = cmd
                self._cond.notify_all()

    @log_helper
    def _emit(self, event: str, level: Level, message: str, **data: Any) -> None:
        self.on_event(event, level, message, data)


def _plan_data(plan: Plan) -> dict[str, Any]:
    return {"generation": plan.gen, "nodes": list(plan.nodes), "step": plan.step, "leader": plan.leader,
            "master_addr": plan.master_addr, "give_up": plan.give_up}
