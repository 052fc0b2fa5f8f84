"""Which of the run's keys a node believes. Anyone who can write under the run's prefix in etcd
could otherwise steer the run (a forged plan restarting every node with a ``MASTER_ADDR`` of the
writer's choice, a forged give-up ending it, a leader key planted without a lease stalling it),
so a node acts only on keys that fit the run's own writes:

* a node record counts only on a lease (its daemon's), filed under its own name;
* the leader key counts only on the lease of the record of the node it names. One that fails
  this for a lease TTL (planted without a lease, or left on someone else's lease) is stale: the
  nodes replace it by an election (:attr:`View.leader_stale`);
* a plan counts only when it names the current leader and its lease (the leader writes it in a
  transaction that compares the leader key's lease, so only the leader's write lands). A node
  keeps the plan it believed until the leader writes the next (a new leader and its followers
  inherit it); a node without one (just started) also believes a plan written before the
  current leader's election, which no one can check any more;
* an end request counts only on the leader's lease, or from a member of that generation on the
  lease of its record (as seen, or as the believed plan names it: a follower does not watch the
  records, the leader saw them when it planned);
* a give-up counts only from a member of the current generation, on a lease its record was seen
  on (or the plan names);
* the leader's word on differing launches (``P/mismatch``) counts only on the leader's lease.

Everything else is left out of the view, with one warning per key revision. These checks keep
stray and naive writers out; a deliberate one who can read the leases must be kept out of etcd
itself (TLS client certificates or user/password auth, ``[cluster]``). Pure: no I/O, no clock.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import Callable, Sequence

from .etcdtypes import KeyValue, wire_text
from .runkeys import EndRequest, Keys, NodeRecord, Plan, View

_Ignore = Callable[[KeyValue, str], None]  # check()'s ignore(kv, why): one warning per key revision
MAX_WARNED = 4096  # remembered (key, revision) warnings: a flood of forged keys must not grow memory


@dataclass(frozen=True)
class GaveUpNote:
    """``P/gave_up/<id>``: why the node's supervisor gave up, in which generation, on which lease."""

    reason: str
    gen: int = 0
    lease: int = 0

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "reason": wire_text(self.reason)}, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> "GaveUpNote":
        try:
            d = json.loads(text)
        except ValueError:
            d = None
        if not isinstance(d, dict):  # a bare reason: no lease, not believed
            return GaveUpNote(text[:200])
        return GaveUpNote(str(d.get("reason", ""))[:500], int(d.get("gen") or 0), int(d.get("lease") or 0))


class Trust:
    """One node's belief across turns: the plan, end requests and give-ups it accepted, and the
    leases each node's record was seen on. :meth:`check` with every key as read; the believed
    view and the warnings to log."""

    def __init__(self, lease_ttl_s: float) -> None:
        self.lease_ttl_s = lease_ttl_s
        self.plan: Plan | None = None
        self.plan_rev = 0
        self.ends: dict[int, tuple[int, EndRequest]] = {}  # gen -> (mod revision, request)
        self.gave_up: dict[str, tuple[int, str]] = {}  # node -> (mod revision, reason)
        self.leases: dict[str, set[int]] = {}  # node -> the leases its record was seen on
        self.bad_leader_since: float | None = None
        self._warned: set[tuple[str, int]] = set()

    def check(self, keys: Keys, kvs: Sequence[KeyValue], raw: View, now: float) -> tuple[View, list[str]]:
        notes: list[str] = []

        def ignore(kv: KeyValue, why: str) -> None:
            if (kv.key, kv.mod_revision) in self._warned:
                return
            if len(self._warned) >= MAX_WARNED:
                self._warned.clear()
            self._warned.add((kv.key, kv.mod_revision))
            notes.append(f"ignored {kv.key} (revision {kv.mod_revision}): {why}")

        nodes, leases = self._nodes(keys, kvs, ignore)
        by_key = {kv.key: kv for kv in kvs}
        leader, leader_lease, stale = self._leader(by_key.get(keys.leader), leases, now, ignore)
        lkv = by_key.get(keys.leader)
        pkv = by_key.get(keys.plan)
        floor = 0
        if pkv is not None and raw.plan is not None:
            floor = raw.plan.gen
            if pkv.mod_revision != self.plan_rev:
                p = raw.plan
                if leader is not None and p.leader == leader and p.lease == leader_lease:
                    self.plan, self.plan_rev = p, pkv.mod_revision
                elif self.plan is None and leader is not None and lkv is not None and pkv.mod_revision < lkv.create_revision:
                    self.plan, self.plan_rev = p, pkv.mod_revision  # the previous leader's: no one can check it now
                elif leader is not None:  # no leader (an election under way): checked once there is one
                    ignore(pkv, f"a plan for generation {p.gen} naming leader {p.leader!r} on lease {p.lease:x}, but the "
                                f"leader is {leader} on lease {leader_lease:x}; this node keeps generation "
                                f"{self.plan.gen if self.plan else 'none'}")
        plan = self.plan
        ends, end_revs = self._ends(keys, kvs, plan, leader_lease, leases, ignore)
        gave_up = self._gave_up(keys, kvs, plan, ignore)
        differ, mkv = raw.mismatch, by_key.get(keys.mismatch)
        if mkv is not None and (not mkv.lease or mkv.lease != leader_lease):
            differ = None
            if leader is not None:
                ignore(mkv, f"a launch mismatch note on lease {mkv.lease:x}, not the leader's ({leader_lease:x})")
        return replace(raw, nodes=nodes, leader=leader, plan=plan, plan_rev=pkv.mod_revision if pkv else 0,
                       ends=ends, gave_up=gave_up, leader_rev=lkv.mod_revision if lkv else 0, leader_stale=stale,
                       end_revs=end_revs, floor_gen=floor, node_leases=leases, mismatch=differ), notes

    def _nodes(self, keys: Keys, kvs: Sequence[KeyValue], ignore: _Ignore) -> tuple[dict[str, NodeRecord],
                                                                                      dict[str, int]]:
        nodes: dict[str, NodeRecord] = {}
        leases: dict[str, int] = {}
        prefix = keys.nodes
        cut = len(prefix)
        seen_on = self.leases
        for kv in kvs:  # every node's record after each change: kept to the few operations it needs
            if not kv.key.startswith(prefix):
                continue
            name = kv.key[cut:]
            try:
                rec = NodeRecord.from_json(kv.value)
            except (ValueError, KeyError, TypeError):
                continue  # a newer supervisor's record: skipped, as View.parse does
            if rec.node_id != name or not kv.lease:
                ignore(kv, f"a node record for {rec.node_id!r} " + ("without a lease (a daemon's record lives on its "
                       "lease)" if not kv.lease else "filed under another name"))
                continue
            nodes[name] = rec
            leases[name] = kv.lease
            seen = seen_on.get(name)
            if seen is None:
                seen_on[name] = {kv.lease}
            else:
                seen.add(kv.lease)
        return nodes, leases

    def _leader(self, kv: KeyValue | None, leases: dict[str, int], now: float,
                ignore: _Ignore) -> tuple[str | None, int, bool]:
        if kv is None:
            self.bad_leader_since = None
            return None, 0, False
        if kv.lease and leases.get(kv.value) == kv.lease:
            self.bad_leader_since = None
            return kv.value, kv.lease, False
        if self.bad_leader_since is None:
            self.bad_leader_since = now
        on = f"lease {kv.lease:x}" if kv.lease else "no lease"
        ignore(kv, f"the leader key names {kv.value!r} on {on}, which is not the lease of that node's record; no "
                   f"node follows it, and an election replaces it after {self.lease_ttl_s:g} s")
        return None, 0, now - self.bad_leader_since >= self.lease_ttl_s

    def _ends(self, keys: Keys, kvs: Sequence[KeyValue], plan: Plan | None, leader_lease: int, leases: dict[str, int],
              ignore: _Ignore) -> tuple[dict[int, EndRequest], dict[int, int]]:
        ends: dict[int, EndRequest] = {}
        revs: dict[int, int] = {}
        prefix = f"{keys.prefix}/end/"
        for kv in kvs:
            if not kv.key.startswith(prefix):
                continue
            try:
                req = EndRequest.from_json(kv.value)
            except (ValueError, KeyError, TypeError) as e:  # a newer supervisor's request, say (an unknown action)
                ignore(kv, f"an end request this supervisor cannot read ({e}); its generation still ends once the "
                           "leader sees its nodes stopped")
                continue
            if kv.key != keys.end(req.gen):
                ignore(kv, f"an end request for generation {req.gen} filed under another generation")
                continue
            revs[req.gen] = kv.mod_revision
            known = self.ends.get(req.gen)
            if known is not None and known[0] == kv.mod_revision:
                ends[req.gen] = known[1]
                continue
            member = (plan is not None and plan.gen == req.gen and req.by in plan.nodes
                      and req.lease in (leases.get(req.by), plan.lease_of(req.by)))
            if req.lease and (req.lease == leader_lease or member):
                self.ends[req.gen] = (kv.mod_revision, req)
                ends[req.gen] = req
            else:
                ignore(kv, f"an end request for generation {req.gen} by {req.by!r} on lease {req.lease:x}: neither the "
                           "leader's lease nor the lease of a member of that generation")
        return ends, revs

    def _gave_up(self, keys: Keys, kvs: Sequence[KeyValue], plan: Plan | None, ignore: _Ignore) -> dict[str, str]:
        out: dict[str, str] = {}
        current = plan.gen if plan is not None else 0
        prefix = f"{keys.prefix}/gave_up/"
        for kv in kvs:
            if not kv.key.startswith(prefix):
                continue
            node = kv.key.rsplit("/", 1)[1]
            known = self.gave_up.get(node)
            if known is not None and known[0] == kv.mod_revision:
                out[node] = known[1]
                continue
            note = GaveUpNote.from_json(kv.value)
            if plan is not None and plan.give_up:
                continue  # the run has given up already: the nodes' own give-ups that follow add nothing
            member = node in plan.nodes if plan is not None else node in self.leases
            seen = note.lease in self.leases.get(node, ()) or (plan is not None and note.lease == plan.lease_of(node))
            if note.lease and seen and member and current - 1 <= note.gen <= current:
                self.gave_up[node] = (kv.mod_revision, note.reason)
                out[node] = note.reason
            else:
                ignore(kv, f"a give-up from {node!r} (generation {note.gen}, lease {note.lease:x}), which is not a member "
                           f"of the current generation ({current}) on a lease its record was seen on")
        return out
