"""What plugs a node's supervisor into a multi-node run (``[cluster]`` with endpoints).

Two parts, both built by :func:`supervisor.daemon.wiring.build_daemon` only when the section
is on, so a single-node daemon neither imports nor runs any of this:

* :class:`ClusterConcern`: the node's :class:`~supervisor.cluster.agent.ClusterAgent`. A local
  failure (the machine stopping the job for a detection, or the job exiting with a failure)
  becomes a request to end the generation; another node's request (or a lost node, or etcd out
  of reach past the fence) reaches the machine as a detection with the same cause, so every
  node stops its job the way it stops it alone, and books the same failure (the same restart
  budget and remedy ladder everywhere). The leader's decisions are mirrored into the local
  ledger as ``cluster_*`` events; ``status`` shows every node.
* :class:`ClusterCheckpoints`: the checkpoint port with the launch barrier in front. On the
  launch preparation thread (off the main loop) it publishes the steps verified here, waits for
  the leader's plan and resumes from the plan's step; the job gets ``TSUP_GENERATION``,
  ``TSUP_NODE_RANK``, ``TSUP_NNODES``, ``TSUP_MASTER_ADDR``/``MASTER_ADDR`` and the port.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import structlog

from ..core.causes import Action, Cause
from ..core.machine import State
from ..core.messages import EXIT_GAVE_UP, EXIT_OK, EndAttempt, Resume
from ..core.observations import Detection, MetricRecord
from ..logsite import Site, callsite, log_helper, logged_from
from .ports import CheckpointStore, Concern, DaemonView
from ..cluster.agent import ClusterAgent, ClusterGaveUp
from ..cluster.config import ClusterConfig
from ..cluster.coord import Rules
from ..cluster.etcd import EtcdClient
from ..cluster.launchprobe import launch_digest_or_none
from ..cluster.runkeys import EndRequest, Keys, Plan

if TYPE_CHECKING:
    from ..config.model import Config

log = structlog.get_logger("supervisor.cluster")

SOURCE = "cluster:"  # the detection source of another node's failure: it is not requested again
STATUS_READ_S = 1.0  # a person's `status` on a follower waits at most this for the node records (live_status)


def _cause(name: str) -> Cause:
    try:
        return Cause(name)
    except ValueError:
        return Cause.NODE_LOST  # a node gave up, or a cause this version does not know


class ClusterConcern(Concern):
    name = "cluster"

    def __init__(self, cc: ClusterConfig, job_name: str,
                 agent_factory: Callable[..., ClusterAgent] | None = None) -> None:
        self.cc = cc
        self.job_name = job_name
        self.agent_factory = agent_factory or ClusterAgent
        self.agent: ClusterAgent | None = None
        self.daemon: DaemonView | None = None
        self.plan: Plan | None = None  # the generation the next (or current) attempt runs in
        self._events: deque[tuple[str, str, str, Mapping[str, Any], Site | None]] = deque()
        self._requested: set[int] = set()  # attempts whose failure was sent to the cluster

    def start(self, daemon: DaemonView) -> None:
        self.daemon = daemon
        cc = self.cc
        client = EtcdClient(cc.endpoints, timeout_s=cc.request_timeout_s, tls=cc.tls(), auth=cc.password_auth())
        if cc.secured:  # refused credentials end the start with etcd's reason, not a run of retries
            client.check_access(cc.key_prefix(self.job_name))
        rules = Rules(cc.nodes, cc.min_needed(), cc.wait_for_nodes_s, cc.lease_ttl_s)
        self.agent = self.agent_factory(client, Keys(cc.key_prefix(self.job_name)), cc.node_name(), cc.address(),
                                        rules, on_stop=self._stop_from_cluster, on_event=self._queue_event)
        self.agent.start()
        daemon.event("cluster_started", "info", f"node {cc.node_name()} of a {cc.nodes}-node run (min "
                     f"{cc.min_needed()}), etcd {', '.join(cc.endpoints)}, keys under {cc.key_prefix(self.job_name)}; "
                     "every launch waits for the leader's plan", node_id=cc.node_name(), addr=cc.address())

    # ------------------------------------------------------------------ from the agent thread
    @log_helper
    def _queue_event(self, event: str, level: str, message: str, data: Mapping[str, Any]) -> None:
        # The main loop writes them at its next tick; the journal's CODE_* stay the agent's line.
        self._events.append((event, level, message, data, callsite()))

    def _stop_from_cluster(self, req: EndRequest) -> None:
        assert self.daemon is not None
        self.daemon.emit(Detection(_cause(req.cause), f"generation {req.gen} ended by node {req.by}: {req.summary}",
                                   SOURCE + req.by, step=req.step, onset_step=req.onset_step,
                                   details={"generation": req.gen, "by": req.by, "cause": req.cause},
                                   at=self.daemon.clock.time()))

    # ------------------------------------------------------------------ the daemon's hooks
    def job_env(self) -> Mapping[str, str]:
        plan, agent = self.plan, self.agent
        if plan is None or agent is None or agent.node_id not in plan.nodes:
            return {}
        port = str(self.cc.master_port)
        return {"TSUP_GENERATION": str(plan.gen), "TSUP_NODE_RANK": str(plan.rank(agent.node_id)),
                "TSUP_NNODES": str(len(plan.nodes)), "TSUP_NODE_ID": agent.node_id,
                "TSUP_MASTER_ADDR": plan.master_addr, "TSUP_MASTER_PORT": port,
                "MASTER_ADDR": plan.master_addr, "MASTER_PORT": port,
                "TSUP_RDZV_ID": f"{self.job_name}-g{plan.gen}"}

    def tick(self, now: float) -> None:
        d, agent = self.daemon, self.agent
        if d is None or agent is None:
            return
        while self._events:
            event, level, message, data, site = self._events.popleft()
            with logged_from(site):
                d.event(event, level, message, **data)
        run = d.run_view()
        agent.set_state(run.state.value)
        # The fast path: the machine began stopping the job for a failure seen here; the others
        # stop now, not after this node's grace period.
        if run.state is State.STOPPING and run.root is not None and run.decision is not None:
            self._request(run.attempt, run.root, run.decision.action)

    def attempt_ended(self, end: EndAttempt, resume: Resume, wall: float) -> None:
        if end.cause is None or end.detection is None:
            if end.cause is not None:  # a crash without a detection object
                self._request(end.attempt, Detection(end.cause, end.summary, "exit", at=wall),
                              end.action or Action.RESTART)
            return
        self._request(end.attempt, end.detection, end.action or Action.RESTART)

    def _request(self, attempt: int, d: Detection, action: Action) -> None:
        if attempt in self._requested or d.source.startswith(SOURCE) or self.agent is None:
            return
        self._requested.add(attempt)
        self.agent.request_end(d.cause.value, d.summary, d.step, d.onset_step, action.value)

    def status(self) -> Mapping[str, Any]:
        return {"cluster": self.agent.status()} if self.agent is not None else {}

    def live_status(self) -> Mapping[str, Any]:
        # A person's `status`: a follower reads the node records it does not watch (its agent's
        # thread does the read; this waits for it at most STATUS_READ_S, then shows the last read).
        return {"cluster": self.agent.status(wait_s=STATUS_READ_S)} if self.agent is not None else {}

    def close(self) -> None:
        d, agent = self.daemon, self.agent
        if agent is None or d is None:
            return
        gave_up = None
        run = d.run_view()
        if run.exit_code == EXIT_OK and run.state is State.FINISHED:
            agent.finished()
        elif run.exit_code == EXIT_GAVE_UP:
            gave_up = f"node {agent.node_id}: {run.exit_reason}"
        agent.close(gave_up=gave_up)
        while self._events:  # the last words (the ledger is still open)
            event, level, message, data, site = self._events.popleft()
            with logged_from(site):
                d.event(event, level, message, **data)


class ClusterCheckpoints:
    """The checkpoint port of a node in a multi-node run: the local store, with the launch
    barrier in :meth:`choose` (on the launch preparation thread)."""

    def __init__(self, inner: CheckpointStore, concern: ClusterConcern) -> None:
        self.inner = inner  # the local store, through its interface only
        self.concern = concern

    def book_last_attempt(self) -> str | None:
        return self.inner.book_last_attempt()

    def emergency_checkpoint_probe(self) -> Callable[[], bool] | None:
        return self.inner.emergency_checkpoint_probe()

    def ready_steps(self) -> dict[int, str]:
        return self.inner.ready_steps()

    def choose(self, cfg: Config, action: Action, onset_step: int | None, explicit: str | None,
               metrics: Sequence[MetricRecord]) -> Resume:
        agent = self.concern.agent
        assert agent is not None
        rows = self.inner.ready_steps()
        # ClusterGaveUp (a GiveUp) goes up as it is: the machine gives up with its cause.
        plan = agent.wait_for_generation(sorted(rows), digest=launch_digest_or_none(cfg))
        self.concern.plan = plan
        if explicit:
            log.warning("cluster_explicit_checkpoint_ignored", path=explicit,
                        message="restart --from is not used in a multi-node run: the leader chooses the step")
        if plan.step is None:
            return Resume(None, None, f"generation {plan.gen}: {plan.reason}")
        path = rows.get(plan.step)
        if path is None:  # verified here a moment ago; gone since: the job cannot resume as agreed
            raise ClusterGaveUp(f"the checkpoint of step {plan.step} chosen for generation {plan.gen} is no longer "
                                "ready on this node")
        return Resume(path, plan.step, f"generation {plan.gen}: {plan.reason}")
