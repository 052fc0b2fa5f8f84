"""The coordination rules alone: scripted views in, commands out; no etcd, thread or clock."""

from __future__ import annotations

import json

import pytest

from supervisor.core.causes import ActionSpec, Action, forget_action, new_action, register_action
from supervisor.cluster.coord import (NODE_LOST, Abandon, Campaign, Coordinator, Join, RequestEnd, Rules, StopLocal,
                                      WritePlan, choose_step)
from supervisor.cluster.runkeys import EndRequest, Keys, NodeRecord, Phase, Plan, View

RULES = Rules(nodes=3, min_nodes=2, wait_for_nodes_s=30.0, lease_ttl_s=5.0)


def rec(node: str, phase: Phase = Phase.WAITING, gen: int = 0, steps: tuple[int, ...] = ()) -> NodeRecord:
    return NodeRecord(node, f"10.0.0.{node[-1]}", phase, gen, steps)


def view(*records: NodeRecord, leader: str | None = "n1", plan: Plan | None = None,
         ends: dict[int, EndRequest] | None = None, finished: dict[str, int] | None = None) -> View:
    return View({r.node_id: r for r in records}, leader, plan, 7 if plan else 0, ends or {}, finished or {})


def plan(gen: int, nodes: tuple[str, ...] = ("n1", "n2", "n3"), step: int | None = None,
         give_up: str | None = None) -> Plan:
    return Plan(gen, nodes, step, "n1", "10.0.0.1", "test", give_up)


def only(cmds: list, kind: type):
    found = [c for c in cmds if isinstance(c, kind)]
    assert len(found) == 1, f"expected one {kind.__name__} in {cmds}"
    return found[0]


def test_no_leader_every_node_campaigns() -> None:
    c = Coordinator("n2", RULES)
    assert Campaign() in c.step(view(rec("n2"), leader=None), rec("n2"), 0.0)


def test_first_generation_starts_when_all_nodes_are_ready_leader_is_rank_zero() -> None:
    lead = Coordinator("n2", RULES)
    v = view(rec("n1"), rec("n2"), leader="n2")
    assert lead.step(v, rec("n2"), 0.0) == []  # 2 of 3: waits for the third
    v = view(rec("n1"), rec("n2"), rec("n3"), leader="n2")
    wp = only(lead.step(v, rec("n2"), 1.0), WritePlan)
    assert wp.plan.gen == 1 and wp.plan.nodes == ("n2", "n1", "n3") and wp.plan.master_addr == "10.0.0.2"
    assert wp.plan.step is None and wp.expect_rev == 0 and not wp.plan.give_up


def test_every_waiting_node_joins_with_its_rank_once() -> None:
    c = Coordinator("n3", RULES)
    p = plan(1)
    v = view(rec("n1"), rec("n2"), rec("n3"), plan=p)
    assert only(c.step(v, rec("n3"), 0.0), Join) == Join(p, 2)
    assert c.step(v, rec("n3"), 0.1) == []  # the same plan is joined once


def test_after_wait_for_nodes_the_leader_starts_with_min_nodes_or_gives_up() -> None:
    lead = Coordinator("n1", RULES)
    two = view(rec("n1"), rec("n2"))
    assert lead.step(two, rec("n1"), 0.0) == []
    wp = only(lead.step(two, rec("n1"), 30.0), WritePlan)
    assert wp.plan.nodes == ("n1", "n2") and not wp.plan.give_up
    lead = Coordinator("n1", RULES)
    one = view(rec("n1"))
    assert lead.step(one, rec("n1"), 0.0) == []
    wp = only(lead.step(one, rec("n1"), 31.0), WritePlan)
    assert wp.plan.give_up and "min_nodes = 2" in wp.plan.give_up and wp.plan.nodes == ()


def test_a_failure_anywhere_stops_every_node_once() -> None:
    end = EndRequest(1, "n2", "nan", "loss is nan at step 70", 70, 65, Action.ROLLBACK)
    for node in ("n1", "n2", "n3"):
        c = Coordinator(node, RULES)
        me = rec(node, Phase.RUNNING, 1)
        v = view(*(rec(n, Phase.RUNNING, 1) for n in ("n1", "n2", "n3")), plan=plan(1), ends={1: end})
        assert only(c.step(v, me, 0.0), StopLocal).request == end
        assert not [x for x in c.step(v, me, 0.1) if isinstance(x, StopLocal)]


def test_leader_waits_for_every_member_to_stop_then_picks_the_common_step_before_the_onset() -> None:
    lead = Coordinator("n1", RULES)
    end = EndRequest(1, "n2", "nan", "loss is nan", 70, 65, Action.ROLLBACK)
    stopped = [rec("n1", Phase.WAITING, 1, (20, 40, 60, 80)), rec("n2", Phase.WAITING, 1, (20, 40, 60))]
    v = view(*stopped, rec("n3", Phase.RUNNING, 1), plan=plan(1), ends={1: end})
    assert not [x for x in lead.step(v, stopped[0], 0.0) if isinstance(x, WritePlan)]  # n3 still running
    v = view(*stopped, rec("n3", Phase.WAITING, 1, (40, 60, 80)), plan=plan(1), ends={1: end})
    wp = only(lead.step(v, stopped[0], 1.0), WritePlan)
    assert wp.plan.gen == 2 and wp.plan.step == 60 and wp.expect_rev == 7  # 80 is not on n2; 60 < onset 65
    assert "nan on n2" in wp.plan.reason


def test_choose_step() -> None:
    a, b = rec("n1", steps=(10, 20, 30)), rec("n2", steps=(10, 30))
    assert choose_step([a, b], Action.RESTART, None) == 30
    assert choose_step([a, b], Action.ROLLBACK, 30) == 10  # strictly before the onset
    assert choose_step([a, rec("n3", steps=())], Action.RESTART, None) is None  # nothing shared: fresh start


def test_an_end_request_carries_the_action_by_name_and_the_leader_reads_its_spec() -> None:
    """The wire format is the action's name; the coordinator acts on ACTIONS' facts (an action
    added outside the package chooses its step by its spec); an unknown name is refused by name."""
    end = EndRequest(1, "n2", "nan", "loss is nan", 70, 65, Action.ROLLBACK)
    assert json.loads(end.to_json())["action"] == "rollback" and EndRequest.from_json(end.to_json()) == end
    assert EndRequest.from_json(json.dumps({"gen": 1, "by": "n2", "cause": "crash"})).action is Action.RESTART
    with pytest.raises(ValueError, match="unknown action 'pause' .*known: restart, rollback, give_up, warn"):
        EndRequest.from_json(json.dumps({"gen": 1, "by": "n2", "cause": "crash", "action": "pause"}))
    added = new_action("rewind")
    try:
        register_action(ActionSpec(added, "a stand-in: relaunch before the onset", ends_attempt=True,
                                   relaunches=True, before_onset=True))
        text = EndRequest(1, "n2", "nan", "loss is nan", 70, 65, added).to_json()
        assert EndRequest.from_json(text).action is added
        assert choose_step([rec("n1", steps=(10, 30)), rec("n2", steps=(10, 30))], added, 30) == 10
    finally:
        forget_action(added)


def test_lease_expiry_of_a_member_is_node_lost_requested_by_the_leader() -> None:
    lead = Coordinator("n1", RULES)
    v = view(rec("n1", Phase.RUNNING, 1), rec("n3", Phase.RUNNING, 1), plan=plan(1))  # n2's key expired
    req = only(lead.step(v, rec("n1", Phase.RUNNING, 1), 0.0), RequestEnd).request
    assert req.cause == NODE_LOST and req.gen == 1 and "n2" in req.summary
    follower = Coordinator("n3", RULES)
    assert follower.step(v, rec("n3", Phase.RUNNING, 1), 0.0) == []  # only the leader declares a node lost


def test_lost_node_then_min_nodes_go_on_without_it_and_a_late_node_waits_for_the_next_generation() -> None:
    lead = Coordinator("n1", RULES)
    end = EndRequest(1, "n1", NODE_LOST, "node n2 lost")
    v = view(rec("n1", Phase.WAITING, 1, (50,)), rec("n3", Phase.WAITING, 1, (50,)), plan=plan(1), ends={1: end})
    assert not [x for x in lead.step(v, rec("n1", Phase.WAITING, 1), 100.0) if isinstance(x, WritePlan)]
    wp = only(lead.step(v, rec("n1", Phase.WAITING, 1), 130.0), WritePlan)
    assert wp.plan.nodes == ("n1", "n3") and wp.plan.step == 50
    late = Coordinator("n2", RULES)
    v2 = view(rec("n1", Phase.RUNNING, 2), rec("n2", Phase.WAITING, 2), rec("n3", Phase.RUNNING, 2), plan=wp.plan)
    assert late.step(v2, rec("n2", Phase.WAITING, 2), 0.0) == []  # not in generation 2: waits for 3


def test_a_member_whose_supervisor_restarted_ends_the_generation() -> None:
    lead = Coordinator("n1", RULES)
    v = view(rec("n1", Phase.RUNNING, 1), rec("n2", Phase.WAITING, 1), rec("n3", Phase.RUNNING, 1), plan=plan(1))
    assert "n2" in only(lead.step(v, rec("n1", Phase.RUNNING, 1), 0.0), RequestEnd).request.summary


def test_finished_nodes_are_not_lost() -> None:
    lead = Coordinator("n1", RULES)
    v = view(rec("n1", Phase.RUNNING, 1), rec("n3", Phase.RUNNING, 1), plan=plan(1), finished={"n2": 1})
    assert lead.step(v, rec("n1", Phase.RUNNING, 1), 0.0) == []


def test_a_node_that_gave_up_or_asked_to_give_up_ends_the_run_everywhere() -> None:
    lead = Coordinator("n1", RULES)
    end = EndRequest(1, "n3", "nan", "loss is nan", action=Action.GIVE_UP)
    v = view(rec("n1", Phase.WAITING, 1), rec("n2", Phase.WAITING, 1), rec("n3", Phase.WAITING, 1),
             plan=plan(1), ends={1: end})
    wp = only(lead.step(v, rec("n1", Phase.WAITING, 1), 0.0), WritePlan)
    assert wp.plan.give_up and "n3 gave up" in wp.plan.give_up
    follower = Coordinator("n2", RULES)
    v2 = view(rec("n2", Phase.WAITING, 1), plan=wp.plan)
    assert only(follower.step(v2, rec("n2", Phase.WAITING, 1), 0.0), Abandon).reason == wp.plan.give_up


def test_cut_off_a_healthy_job_runs_until_a_generation_without_it_could_start_then_fences() -> None:
    c = Coordinator("n3", RULES)  # TTL 5 s, wait_for_nodes_s 30 s
    me = rec("n3", Phase.RUNNING, 1)
    assert c.lost_contact(me, last_ok=10.0, now=40.0) == []  # an etcd outage far past the TTL: the job goes on
    # The earliest generation without n3: its lease expires (>= 5 s) and the leader waits 30 s for it.
    stop = only(c.lost_contact(me, last_ok=10.0, now=43.4), StopLocal)  # 2/3 TTL + 30 s: a third of a TTL early
    assert stop.request.cause == NODE_LOST and stop.request.gen == 1
    assert c.lost_contact(me, last_ok=10.0, now=50.0) == []  # once
    assert c.lost_contact(rec("n3", Phase.WAITING, 1), last_ok=10.0, now=90.0) == []  # no job: nothing to fence
    c = Coordinator("n3", RULES)  # healed before it noticed: the run is at generation 2 already
    v = view(rec("n1", Phase.RUNNING, 2), rec("n3", Phase.RUNNING, 1), plan=plan(2, ("n1", "n2")))
    assert only(c.step(v, me, 0.0), StopLocal).request.cause == NODE_LOST


def test_view_parses_keys_and_skips_garbage() -> None:
    k = Keys("/tsup/run")
    p = plan(1)
    end = EndRequest(1, "n2", "crash", "exit 1")
    v = View.parse(k, [(k.node("n1"), rec("n1").to_json(), 3), (k.leader, "n1", 4), (k.plan, p.to_json(), 9),
                       (k.end(1), end.to_json(), 10), (k.node("bad"), "{not json", 11), (k.finished("n2"), "1", 12)])
    assert set(v.nodes) == {"n1"} and v.leader == "n1" and v.plan == p and v.plan_rev == 9
    assert v.ends == {1: end} and v.finished == {"n2": 1}


def test_plans_name_daemon_lives_a_restarted_daemon_does_not_join_its_old_generation() -> None:
    lead = Coordinator("n1", RULES)
    recs = [NodeRecord(n, "a", Phase.WAITING, 0, life=f"{n}-life1") for n in ("n1", "n2", "n3")]
    wp = only(lead.step(view(*recs), recs[0], 0.0), WritePlan)
    assert wp.plan.life_of("n2") == "n2-life1"
    reborn = NodeRecord("n2", "a", Phase.WAITING, 0, life="n2-life2")  # its daemon restarted meanwhile
    assert Coordinator("n2", RULES).step(view(reborn, plan=wp.plan), reborn, 0.0) == []
    running = [r.but(phase=Phase.RUNNING, gen=1) for r in recs]
    v = view(running[0], NodeRecord("n2", "a", Phase.STARTING, 1, life="n2-life2"), running[2], plan=wp.plan)
    req = only(lead.step(v, running[0], 1.0), RequestEnd).request
    assert "n2" in req.summary and req.cause == NODE_LOST


def test_a_starting_node_is_not_ready() -> None:
    lead = Coordinator("n1", RULES)
    v = view(rec("n1"), rec("n2"), NodeRecord("n3", "a", Phase.STARTING, 0))
    assert lead.step(v, rec("n1"), 0.0) == []  # 2 ready of 3: waits


def test_a_late_node_waiting_since_an_older_generation_joins_the_next_one() -> None:
    lead = Coordinator("n1", RULES)
    end = EndRequest(2, "n1", "manual", "operator restart")
    v = view(rec("n1", Phase.WAITING, 2), rec("n2", Phase.WAITING, 2), rec("n3", Phase.WAITING, 1),
             plan=plan(2, ("n1", "n2")), ends={2: end})
    wp = only(lead.step(v, rec("n1", Phase.WAITING, 2), 0.0), WritePlan)
    assert wp.plan.gen == 3 and set(wp.plan.nodes) == {"n1", "n2", "n3"}


def test_with_a_member_gone_the_leader_waits_the_full_wait_even_with_spares_ready() -> None:
    rules = Rules(nodes=2, min_nodes=2, wait_for_nodes_s=30.0, lease_ttl_s=5.0)
    lead = Coordinator("n1", rules)
    end = EndRequest(1, "n1", NODE_LOST, "node n2 lost")
    # n2 (a member) is gone but may still run cut off from etcd; n3 is a spare: 2 ready = nodes
    v = view(rec("n1", Phase.WAITING, 1), rec("n3", Phase.WAITING, 0), plan=plan(1, ("n1", "n2")), ends={1: end})
    assert not [x for x in lead.step(v, rec("n1", Phase.WAITING, 1), 0.0) if isinstance(x, WritePlan)]
    wp = only(lead.step(v, rec("n1", Phase.WAITING, 1), 30.0), WritePlan)  # n2's fence (2/3 TTL + 30 s) came first
    assert wp.plan.nodes == ("n1", "n3")


def test_after_an_outage_members_get_a_ttl_to_register_again_before_one_is_lost() -> None:
    lead = Coordinator("n1", RULES)
    lead.contact_since = 100.0  # etcd answered again at 100 (their leases may have expired meanwhile)
    v = view(rec("n1", Phase.RUNNING, 1), rec("n3", Phase.RUNNING, 1), plan=plan(1))  # n2 not registered yet
    assert lead.step(v, rec("n1", Phase.RUNNING, 1), 103.0) == []
    req = only(lead.step(v, rec("n1", Phase.RUNNING, 1), 105.0), RequestEnd).request
    assert req.cause == NODE_LOST and "n2" in req.summary


def test_a_stale_leader_key_is_replaced_by_an_election_and_a_next_plan_goes_past_any_plan_seen() -> None:
    c = Coordinator("n2", RULES)
    present = View({"n2": rec("n2")}, None, leader_rev=5)  # a leader key the checks left out, not yet stale
    assert not [x for x in c.step(present, rec("n2"), 0.0) if isinstance(x, Campaign)]
    assert Campaign(5) in c.step(View({"n2": rec("n2")}, None, leader_rev=5, leader_stale=True), rec("n2"), 1.0)
    lead = Coordinator("n1", RULES)
    v = View({n: rec(n) for n in ("n1", "n2", "n3")}, "n1", None, 9, floor_gen=4)  # a plan key not believed: gen 4
    wp = only(lead.step(v, rec("n1"), 0.0), WritePlan)
    assert wp.plan.gen == 5 and wp.expect_rev == 9
