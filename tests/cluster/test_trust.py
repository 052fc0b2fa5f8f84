"""Which keys a node believes (trust.py), from keys as etcd returns them: no etcd, thread or clock.
The same attacks against a real etcd and real agents: test_forged_keys.py."""

from __future__ import annotations

from supervisor.core.causes import Action
from supervisor.cluster.digest import Mismatch
from supervisor.cluster.etcdtypes import KeyValue
from supervisor.cluster.runkeys import EndRequest, Keys, NodeRecord, Phase, Plan, View
from supervisor.cluster.trust import GaveUpNote, Trust

K = Keys("/tsup/run")
L1, L2, L3 = 0x11, 0x22, 0x33  # the leases of n1 (the leader), n2, n3


class Store:
    """The run's keys with etcd's revisions: each put gets the next revision."""

    def __init__(self) -> None:
        self.rev = 0
        self.kvs: dict[str, KeyValue] = {}

    def put(self, key: str, value: str, lease: int = 0) -> int:
        self.rev += 1
        old = self.kvs.get(key)
        self.kvs[key] = KeyValue(key, value, old.create_revision if old else self.rev, self.rev, 1, lease)
        return self.rev

    def check(self, trust: Trust, now: float = 0.0) -> tuple[View, list[str]]:
        kvs = list(self.kvs.values())
        return trust.check(K, kvs, View.parse(K, ((kv.key, kv.value, kv.mod_revision) for kv in kvs)), now)


def run(members: tuple[str, ...] = ("n1", "n2", "n3")) -> Store:
    s = Store()
    for n, lease in (("n1", L1), ("n2", L2), ("n3", L3)):
        s.put(K.node(n), NodeRecord(n, "10.0.0.1", Phase.RUNNING, 1).to_json(), lease)
    s.put(K.leader, "n1", L1)
    s.put(K.plan, Plan(1, members, None, "n1", "10.0.0.1", "first", lease=L1).to_json())
    return s


def test_the_leaders_plan_is_believed_a_forged_one_is_ignored_once_and_the_believed_one_kept() -> None:
    s, t = run(), Trust(5.0)
    v, notes = s.check(t)
    assert v.leader == "n1" and v.plan is not None and v.plan.gen == 1 and notes == []
    forged = Plan(2, ("n1", "n2", "n3"), None, "n1", "6.6.6.6", "forged")  # no lease
    rev = s.put(K.plan, forged.to_json())
    v, notes = s.check(t)
    assert v.plan is not None and v.plan.gen == 1 and v.plan_rev == rev and v.floor_gen == 2
    assert len(notes) == 1 and "generation 2" in notes[0] and "keeps generation 1" in notes[0]
    assert s.check(t)[1] == []  # one warning per key revision
    s.put(K.plan, Plan(2, ("n1",), None, "n1", "6.6.6.6", "forged", lease=L2).to_json())  # another node's lease
    assert s.check(t)[0].plan.gen == 1  # type: ignore[union-attr]


def test_a_new_leader_and_a_fresh_node_keep_or_take_the_previous_leaders_plan() -> None:
    s = run()
    old = Trust(5.0)
    s.check(old)
    del s.kvs[K.leader], s.kvs[K.node("n1")]  # n1's lease expired: n2 leads
    fresh = Trust(5.0)  # started now, mid-election: nothing to check the plan against yet, no warning
    v, notes = s.check(fresh)
    assert v.leader is None and v.plan is None and notes == []
    s.put(K.leader, "n2", L2)
    v, notes = s.check(old)
    assert v.leader == "n2" and v.plan is not None and v.plan.gen == 1 and notes == []
    v, notes = s.check(fresh)  # the plan predates this leader's election: believed
    assert v.leader == "n2" and v.plan is not None and v.plan.gen == 1 and notes == []


def test_a_leader_key_without_a_lease_or_on_another_lease_is_ignored_then_stale_after_a_ttl() -> None:
    s, t = run(), Trust(5.0)
    rev = s.put(K.leader, "intruder")  # no lease
    v, notes = s.check(t, now=10.0)
    assert v.leader is None and v.leader_rev == rev and not v.leader_stale and "no lease" in notes[0]
    assert s.check(t, now=14.0)[0].leader_stale is False
    assert s.check(t, now=15.0)[0].leader_stale is True  # a TTL: an election replaces it
    s.put(K.leader, "n2", L3)  # a lease, but not n2's
    v, notes = s.check(t, now=16.0)
    assert v.leader is None and "lease 33" in notes[0]
    s.put(K.leader, "n2", L2)
    v, _ = s.check(t, now=17.0)
    assert v.leader == "n2" and not v.leader_stale and t.bad_leader_since is None


def test_node_records_count_only_on_a_lease_under_their_own_name() -> None:
    s, t = run(), Trust(5.0)
    s.put(K.node("evil"), NodeRecord("evil", "6.6.6.6", Phase.WAITING, 0).to_json())  # no lease
    s.put(K.node("x"), NodeRecord("n2", "6.6.6.6", Phase.WAITING, 0).to_json(), L3)  # n2's record under x
    v, notes = s.check(t)
    assert set(v.nodes) == {"n1", "n2", "n3"} and v.nodes["n2"].addr == "10.0.0.1" and len(notes) == 2


def test_end_requests_count_from_the_leader_or_a_member_on_its_lease() -> None:
    s, t = run(("n1", "n2")), Trust(5.0)
    s.check(t)
    s.put(K.end(1), EndRequest(1, "n3", "nan", "not a member", lease=L3).to_json())
    v, notes = s.check(t)
    assert v.ends == {} and v.end_revs == {1: s.rev} and "n3" in notes[0]
    s.put(K.end(1), EndRequest(1, "n2", "nan", "forged: no lease").to_json())
    assert s.check(t)[0].ends == {}
    member = EndRequest(1, "n2", "nan", "loss is nan", lease=L2)
    s.put(K.end(1), member.to_json())
    assert s.check(t)[0].ends == {1: member}
    del s.kvs[K.node("n2")]  # n2's daemon died after asking: the request stays believed
    assert s.check(t)[0].ends == {1: member}
    s2, t2 = run(("n1", "n2")), Trust(5.0)
    by_leader = EndRequest(1, "n2", "gave_up", "budget spent", action=Action.GIVE_UP, lease=L1)
    s2.put(K.end(1), by_leader.to_json())
    assert s2.check(t2)[0].ends == {1: by_leader}
    s2.put(K.end(5), EndRequest(1, "n1", "nan", "filed under another generation", lease=L1).to_json())
    assert "another generation" in s2.check(t2)[1][0]
    # A newer supervisor's request (an action this one does not know) is said, not silently dropped.
    s2.put(K.end(2), by_leader.to_json().replace('"give_up"', '"pause"'))
    notes = s2.check(t2)[1]
    assert any("cannot read" in n and "unknown action 'pause'" in n for n in notes), notes


def test_give_ups_count_only_from_members_of_the_current_generation_on_a_lease_seen() -> None:
    s, t = run(("n1", "n2")), Trust(5.0)
    s.check(t)
    s.put(K.gave_up("intruder"), "restart budget spent")
    s.put(K.gave_up("n3"), GaveUpNote("not a member", 1, L3).to_json())
    s.put(K.gave_up("n2"), GaveUpNote("forged: another lease", 1, L1).to_json())
    v, notes = s.check(t)
    assert v.gave_up == {} and len(notes) == 3
    s.put(K.gave_up("n2"), GaveUpNote("budget spent", 1, L2).to_json())
    del s.kvs[K.node("n2")]  # it revokes its lease as it leaves: the give-up still counts
    v, _ = s.check(t)
    assert v.gave_up == {"n2": "budget spent"}


def test_after_the_run_gave_up_the_nodes_own_give_ups_are_skipped_without_a_warning() -> None:
    s, t = run(("n1", "n2")), Trust(5.0)
    s.put(K.plan, Plan(2, (), None, "n1", "", "n2 gave up", give_up="the cluster gives up", lease=L1).to_json())
    s.put(K.gave_up("n1"), GaveUpNote("the cluster gives up", 1, L1).to_json())
    v, notes = s.check(t)
    assert v.plan is not None and v.plan.give_up and v.gave_up == {} and notes == []


def follower_store() -> Store:
    """What a follower's copy holds: no node records but the leader's (read by the agent), a plan
    naming each member's record lease."""
    s = Store()
    s.put(K.node("n1"), NodeRecord("n1", "10.0.0.1", Phase.RUNNING, 1).to_json(), L1)
    s.put(K.leader, "n1", L1)
    s.put(K.plan, Plan(1, ("n1", "n2", "n3"), None, "n1", "10.0.0.1", "first", lease=L1,
                       leases=(L1, L2, L3)).to_json())
    return s


def test_a_follower_checks_a_members_end_request_and_give_up_against_the_leases_the_plan_names() -> None:
    s, t = follower_store(), Trust(5.0)
    s.put(K.end(1), EndRequest(1, "n2", "nan", "loss is nan", lease=0x99).to_json(), 0x99)  # not n2's lease
    v, notes = s.check(t)
    assert v.ends == {} and len(notes) == 1 and "n2" in notes[0]
    s.put(K.end(1), EndRequest(1, "n2", "nan", "loss is nan", lease=L2).to_json(), L2)
    v, notes = s.check(t)
    assert v.ends[1].by == "n2" and notes == []
    s.put(K.gave_up("n3"), GaveUpNote("restart budget spent", 1, L3).to_json())
    s.put(K.gave_up("n4"), GaveUpNote("not a member", 1, L3).to_json())
    v, notes = s.check(t)
    assert v.gave_up == {"n3": "restart budget spent"} and len(notes) == 1 and "'n4'" in notes[0]


def test_the_leaders_mismatch_note_counts_only_on_the_leaders_lease() -> None:
    s, t = follower_store(), Trust(5.0)
    s.put(K.mismatch, Mismatch("seeds.--seed differ: seeds.--seed (n1: 1; n2: 2)", ("n1", "n2")).to_json(), L2)
    v, notes = s.check(t)
    assert v.mismatch is None and len(notes) == 1 and "mismatch" in notes[0]
    s.put(K.mismatch, Mismatch("seeds.--seed differ: seeds.--seed (n1: 1; n2: 2)", ("n1", "n2")).to_json(), L1)
    v, notes = s.check(t)
    assert v.mismatch is not None and v.mismatch.nodes == ("n1", "n2") and "n2: 2" in v.mismatch.text and notes == []
