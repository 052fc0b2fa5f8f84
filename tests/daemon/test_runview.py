"""What concerns read of the run (``DaemonView.run_view``, a frozen :class:`RunView`), built by the
real runner on fakes (``tests/fakes.py``), and the cluster concern reading it instead of the
machine (a fake agent: no etcd)."""
from __future__ import annotations

import dataclasses
import signal
from pathlib import Path
from typing import Any, Callable

import pytest

from supervisor.daemon.clusterconcern import ClusterLink, ClusterPlugin
from supervisor.config.model import config_from_table
from supervisor.core.causes import Action, Cause
from supervisor.core.machine import State
from supervisor.core.messages import EXIT_OK

from ..fakes import config, daemon, step_line




def test_the_view_follows_the_machine_through_a_stop_and_the_end(tmp_path: Path) -> None:
    d = daemon(tmp_path, steps=[100])
    v = d.runner.run_view()
    assert (v.state, v.attempt, v.has_job, v.root, v.decision, v.exit_code) == (State.STARTING, 0, True, None, None, None)
    assert v.resume.checkpoint is None and v.last_metric is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.attempt = 5  # type: ignore[misc]  # a concern cannot change what it was shown
    d.launcher.job.ignore.add(signal.SIGTERM)  # the stop stays under way
    d.lines(*[step_line(s, 2.0) for s in range(100, 106)], step_line(107, "nan"))
    v = d.runner.run_view()
    assert v.state is State.STOPPING and v.root is not None and v.root.cause is Cause.NAN
    assert v.decision is not None and v.decision.action is Action.ROLLBACK
    assert v.last_metric is not None and v.last_metric.step == 107  # the NaN line is a record too
    assert d.runner.run_view() == v  # nothing moved: the same view
    d.clock.advance(3600.0)  # past every grace: SIGKILL ends it; the relaunch follows the backoff
    d.settle()
    d.clock.advance(60.0)
    d.settle()
    v = d.runner.run_view()
    assert v.attempt == 1 and v.root is None and v.decision is None and v.resume.checkpoint == "ckpt/step_100.pt"
    d.launcher.job.exits(0)
    d.settle()
    v = d.runner.run_view()
    assert (v.state, v.exit_code) == (State.FINISHED, EXIT_OK) and v.exit_reason


class FakeAgent:
    """The cluster agent as the concern drives it (no etcd, no thread)."""

    def __init__(self, client: Any, keys: Any, node_id: str, addr: str, rules: Any, *,
                 on_stop: Callable[..., None], on_event: Callable[..., None]) -> None:
        self.node_id = node_id
        self.states: list[str] = []
        self.requests: list[tuple[str, str, int | None, int | None, str]] = []
        self.ended: list[str] = []

    def start(self) -> None:
        pass

    def set_state(self, state: str) -> None:
        if not self.states or self.states[-1] != state:
            self.states.append(state)

    def request_end(self, cause: str, summary: str, step: int | None, onset_step: int | None, action: str) -> None:
        self.requests.append((cause, summary, step, onset_step, action))

    def finished(self) -> None:
        self.ended.append("finished")

    def close(self, gave_up: str | None = None) -> None:
        self.ended.append(f"closed gave_up={gave_up}")

    def status(self) -> dict[str, Any]:
        return {}


def test_the_cluster_concern_asks_the_others_to_stop_from_what_the_view_says(tmp_path: Path) -> None:
    cc = config_from_table({"job": {"command": ["x"]}, "cluster": {"endpoints": ["http://127.0.0.1:9"],
                                                                   "nodes": 2}}).cluster
    agents: list[FakeAgent] = []

    def factory(*a: Any, **kw: Any) -> FakeAgent:
        agents.append(FakeAgent(*a, **kw))
        return agents[-1]

    cluster = ClusterPlugin(cc, "job", agent_factory=factory)  # type: ignore[arg-type]  # the fake agent
    d = daemon(tmp_path, config(tmp_path), concerns=[cluster])
    (agent,) = agents
    d.launcher.job.ignore.add(signal.SIGTERM)
    d.lines(*[step_line(s, 2.0) for s in range(1, 4)], step_line(5, "nan"))
    d.step()
    assert agent.states[-1] == "stopping"
    ((cause, _summary, step, onset, action),) = agent.requests  # at once, not after the grace
    assert (cause, action, step, onset) == ("nan", "rollback", 5, 4)
    d.runner.close()
    assert agent.ended == ["closed gave_up=None"]


def test_the_cluster_store_works_over_the_local_stores_interface_and_the_config_it_is_given(tmp_path: Path) -> None:
    """ClusterCheckpoints publishes the steps the local store (any CheckpointStore: here the fake)
    says are ready, and resumes from the plan's step; it reads neither a service nor a daemon."""
    from supervisor.cluster.runkeys import Plan
    from supervisor.daemon.clusterconcern import ClusterCheckpoints

    from ..fakes import FakeCheckpoints

    cfg = config(tmp_path)
    published: list[list[int]] = []

    class Barrier:
        node_id = "n1"

        def wait_for_generation(self, steps: list[int], digest: Any = None) -> Plan:
            published.append(steps)
            return Plan(3, ("n1",), 100, "n1", "127.0.0.1", "the newest step every node has")

    link = ClusterLink(agent=Barrier())  # type: ignore[arg-type]  # only the barrier is asked
    store = ClusterCheckpoints(FakeCheckpoints(steps=[200, 100]), link)
    resume = store.choose(cfg, Action.ROLLBACK, 150, None, []).resume
    assert published == [[100, 200]] and (resume.checkpoint, resume.step) == ("ckpt/step_100.pt", 100)
    assert link.plan is not None and link.plan.gen == 3


def test_the_cluster_plugin_returns_another_nodes_end_and_the_agents_events_from_its_next_tick(tmp_path: Path) -> None:
    """As plain calls: what the agent's thread hands over (another node ended the generation, a
    mirrored decision) comes back from the next tick as a detection stamped with the turn's wall
    clock and a note; the events left at close are returned for the runner to record."""
    from supervisor.cluster.runkeys import EndRequest
    from supervisor.daemon.effects import Detect, Note
    from supervisor.daemon.plugin import DaemonStarted, Tick

    from ..fakes import FakeLedger
    from .test_plugins import view

    cc = config_from_table({"job": {"command": ["x"]}, "cluster": {"endpoints": ["http://127.0.0.1:9"],
                                                                   "nodes": 2}}).cluster
    hooks: dict[str, Any] = {}

    def factory(*a: Any, **kw: Any) -> FakeAgent:
        hooks.update(kw)
        return FakeAgent(*a, **kw)

    link = ClusterLink()
    p = ClusterPlugin(cc, "job", link, agent_factory=factory)  # type: ignore[arg-type]  # the fake agent
    [started] = p.started(DaemonStarted(FakeLedger(), dict), view(tmp_path))
    assert isinstance(started, Note) and started.event == "cluster_started" and link.agent is not None
    run = view(tmp_path)
    hooks["on_stop"](EndRequest(4, "n2", "nan", "loss nan at step 7", 7, 6))
    hooks["on_event"]("cluster_generation_ended", "warning", "generation 4 ended by n2", {"generation": 4})
    said = p.tick(Tick(run.now), run)
    assert [type(e).__name__ for e in said] == ["Note", "Detect"]
    detect = said[1]
    assert isinstance(detect, Detect) and detect.detection.at == run.wall and detect.detection.source == "cluster:n2"
    assert p.tick(Tick(run.now), run) == []
    hooks["on_event"]("cluster_etcd_back", "info", "etcd answers again", {})
    assert [e.event for e in p.close() or () if isinstance(e, Note)] == ["cluster_etcd_back"]
