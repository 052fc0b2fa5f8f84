"""What plugs a node's supervisor into a multi-node run (``[cluster]`` with endpoints).

Two parts, both built by :func:`supervisor.daemon.wiring.build_daemon` only when the section
is on, so a single-node daemon neither imports nor runs any of this:

* :class:`ClusterPlugin`: the node's :class:`~supervisor.cluster.agent.ClusterAgent`. A local
  failure (the machine stopping the job for a detection, or the job exiting with a failure)
  becomes a request to end the generation; another node's request (or a lost node, or etcd out
  of reach past the fence) reaches the machine as a detection with the same cause, so every
  node stops its job the way it stops it alone, and books the same failure (the same restart
  budget and remedy ladder everywhere). The leader's decisions are mirrored into the local
  ledger as ``cluster_*`` events; ``status`` shows every node. The two share a
  :class:`ClusterLink` (the agent, the plan), made by the wiring.
* :class:`ClusterCheckpoints`: the checkpoint port with the launch barrier in front. On the
  launch preparation thread (off the main loop) it publishes the steps verified here, waits for
  the leader's plan and resumes from the plan's step; the job gets ``TSUP_GENERATION``,
  ``TSUP_NODE_RANK``, ``TSUP_NNODES``, ``TSUP_MASTER_ADDR``/``MASTER_ADDR`` and the port.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, cast

import structlog

from ..core.causes import Action, Cause
from ..core.machine import State
from ..core.messages import EXIT_GAVE_UP, EXIT_OK, Resume
from ..core.observations import Detection, MetricRecord
from ..eventnames import EventName
from ..levels import Level
from ..logsite import callsite, log_helper
from .checkpointstore import Booked, Chosen
from .effects import Detect, Effect, Note
from .plugin import (AttemptEnded, Closes, DaemonStarted, Effects, GivesJobEnv, GivesLiveStatus, GivesStatus,
                     OnAttempts, OnStart, OnTicks, RunView, Tick)
from .ports import CheckpointStore
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


@dataclass
class ClusterLink:
    """What the plug-in and the checkpoint port share, made by the wiring and handed to both: the
    node's agent (started by the plug-in) and the generation the next (or current) attempt runs
    in (set by the port's barrier on the preparation thread, read by the job's env)."""

    agent: ClusterAgent | None = None
    plan: Plan | None = None


class ClusterPlugin(OnStart, OnAttempts, OnTicks, GivesStatus, GivesLiveStatus, GivesJobEnv, Closes):
    name = "cluster"

    def __init__(self, cc: ClusterConfig, job_name: str, link: ClusterLink | None = None,
                 agent_factory: Callable[..., ClusterAgent] | None = None) -> None:
        self.cc = cc
        self.job_name = job_name
        self.link = link or ClusterLink()
        self.agent_factory = agent_factory or ClusterAgent
        self.last: RunView | None = None  # the last turn's view: how the run ended, at close
        # From the agent's thread, returned from the next tick: its events, and another node's end
        # of the generation (a detection, stamped with the loop's clock when it is taken).
        self._events: deque[Note] = deque()
        self._stops: deque[EndRequest] = deque()
        self._requested: set[int] = set()  # attempts whose failure was sent to the cluster

    def started(self, n: DaemonStarted, run: RunView) -> Effects:
        cc = self.cc
        client = EtcdClient(cc.endpoints, timeout_s=cc.request_timeout_s, tls=cc.tls(), auth=cc.password_auth())
        if cc.secured:  # refused credentials end the start with etcd's reason, not a run of retries
            client.check_access(cc.key_prefix(self.job_name))
        rules = Rules(cc.nodes, cc.min_needed(), cc.wait_for_nodes_s, cc.lease_ttl_s)
        self.link.agent = agent = self.agent_factory(client, Keys(cc.key_prefix(self.job_name)), cc.node_name(),
                                                     cc.address(), rules, on_stop=self._stops.append,
                                                     on_event=self._queue_event)
        agent.start()
        return [Note(EventName.CLUSTER_STARTED, Level.INFO, f"node {cc.node_name()} of a {cc.nodes}-node run (min "
                     f"{cc.min_needed()}), etcd {', '.join(cc.endpoints)}, keys under {cc.key_prefix(self.job_name)}; "
                     "every launch waits for the leader's plan", {"node_id": cc.node_name(), "addr": cc.address()})]

    @log_helper
    def _queue_event(self, event: str, level: str, message: str, data: Mapping[str, Any]) -> None:
        # From the agent's thread; the journal's CODE_* stay the agent's line.
        self._events.append(Note(cast(EventName, event), Level(level), message, data, site=callsite()))

    def _taken(self, wall: float) -> list[Effect]:
        said: list[Effect] = []
        while self._events:
            said.append(self._events.popleft())
        while self._stops:
            req = self._stops.popleft()
            said.append(Detect(Detection(_cause(req.cause), f"generation {req.gen} ended by node {req.by}: "
                                         f"{req.summary}", SOURCE + req.by, step=req.step, onset_step=req.onset_step,
                                         details={"generation": req.gen, "by": req.by, "cause": req.cause}, at=wall)))
        return said

    def job_env(self, run: RunView) -> Mapping[str, str]:
        plan, agent = self.link.plan, self.link.agent
        if plan is None or agent is None or agent.node_id not in plan.nodes:
            return {}
        port = str(self.cc.master_port)
        return {"TSUP_GENERATION": str(plan.gen), "TSUP_NODE_RANK": str(plan.rank(agent.node_id)),
                "TSUP_NNODES": str(len(plan.nodes)), "TSUP_NODE_ID": agent.node_id,
                "TSUP_MASTER_ADDR": plan.master_addr, "TSUP_MASTER_PORT": port,
                "MASTER_ADDR": plan.master_addr, "MASTER_PORT": port,
                "TSUP_RDZV_ID": f"{self.job_name}-g{plan.gen}"}

    def tick(self, n: Tick, run: RunView) -> Effects:
        self.last, agent = run, self.link.agent
        if agent is None:
            return ()
        said = self._taken(run.wall)
        agent.set_state(run.state.value)
        # The fast path: the machine began stopping the job for a failure seen here; the others
        # stop now, not after this node's grace period.
        if run.state is State.STOPPING and run.root is not None and run.decision is not None:
            self._request(run.attempt, run.root, run.decision.action)
        return said

    def attempt_ended(self, n: AttemptEnded, run: RunView) -> Effects:
        end = n.end
        if end.cause is None or end.detection is None:
            if end.cause is not None:  # a crash without a detection object
                self._request(end.attempt, Detection(end.cause, end.summary, "exit", at=n.wall),
                              end.action or Action.RESTART)
            return ()
        self._request(end.attempt, end.detection, end.action or Action.RESTART)
        return ()

    def _request(self, attempt: int, d: Detection, action: Action) -> None:
        if attempt in self._requested or d.source.startswith(SOURCE) or self.link.agent is None:
            return
        self._requested.add(attempt)
        self.link.agent.request_end(d.cause.value, d.summary, d.step, d.onset_step, action.value)

    def status(self, run: RunView) -> Mapping[str, Any]:
        return {"cluster": self.link.agent.status()} if self.link.agent is not None else {}

    def live_status(self) -> Mapping[str, Any]:
        # A person's `status`: a follower reads the node records it does not watch (its agent's
        # thread does the read; this waits for it at most STATUS_READ_S, then shows the last read).
        return {"cluster": self.link.agent.status(wait_s=STATUS_READ_S)} if self.link.agent is not None else {}

    def close(self) -> Effects:
        agent, run = self.link.agent, self.last
        if agent is None:
            return ()
        gave_up = None
        if run is not None and run.exit_code == EXIT_OK and run.state is State.FINISHED:
            agent.finished()
        elif run is not None and run.exit_code == EXIT_GAVE_UP:
            gave_up = f"node {agent.node_id}: {run.exit_reason}"
        agent.close(gave_up=gave_up)  # its thread joined: the events below are its last words
        return list(self._events)  # the ledger is still open: the runner records them


class ClusterCheckpoints:
    """The checkpoint port of a node in a multi-node run: the local store, with the launch
    barrier in :meth:`choose` (on the launch preparation thread)."""

    def __init__(self, inner: CheckpointStore, link: ClusterLink) -> None:
        self.inner = inner  # the local store, through its interface only
        self.link = link

    def book_last_attempt(self) -> Booked:
        return self.inner.book_last_attempt()

    def emergency_checkpoint_probe(self) -> Callable[[], bool] | None:
        return self.inner.emergency_checkpoint_probe()

    def ready_steps(self) -> dict[int, str]:
        return self.inner.ready_steps()

    def choose(self, cfg: Config, action: Action, onset_step: int | None, explicit: str | None,
               metrics: Sequence[MetricRecord]) -> Chosen:
        agent = self.link.agent
        assert agent is not None, "a launch prepared before the cluster plug-in started its agent"
        rows = self.inner.ready_steps()
        # ClusterGaveUp (a GiveUp) goes up as it is: the machine gives up with its cause.
        plan = agent.wait_for_generation(sorted(rows), digest=launch_digest_or_none(cfg))
        self.link.plan = plan
        if explicit:
            log.warning("cluster_explicit_checkpoint_ignored", path=explicit,
                        message="restart --from is not used in a multi-node run: the leader chooses the step")
        if plan.step is None:
            return Chosen(Resume(None, None, f"generation {plan.gen}: {plan.reason}"))
        path = rows.get(plan.step)
        if path is None:  # verified here a moment ago; gone since: the job cannot resume as agreed
            raise ClusterGaveUp(f"the checkpoint of step {plan.step} chosen for generation {plan.gen} is no longer "
                                "ready on this node")
        return Chosen(Resume(path, plan.step, f"generation {plan.gen}: {plan.reason}"))
