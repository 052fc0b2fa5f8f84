"""The control socket's slot rule on its own (pure): who gives way when the bounds are reached."""
from __future__ import annotations

import pytest

from supervisor.ops.controlslots import ConnectionSlots, Slot


class Kicks:
    def __init__(self) -> None:
        self.kicked: list[str] = []

    def of(self, name: str):
        return lambda: self.kicked.append(name)


def test_a_uid_at_its_bound_pushes_out_its_own_oldest_reader_never_another_uids():
    k = Kicks()
    slots = ConnectionSlots(total=4, per_uid=2)
    root = slots.admit(0, k.of("root"))
    a1 = slots.admit(1000, k.of("a1"))
    a2 = slots.admit(1000, k.of("a2"))
    assert root and a1 and a2
    a3 = slots.admit(1000, k.of("a3"))
    assert a3 is not None and a1.evicted and k.kicked == ["a1"]
    assert not root.evicted and slots.live() == {0: 1, 1000: 2}
    assert slots.request_read(a1) is False  # the pushed-out one must reply busy


def test_when_full_the_uid_holding_most_gives_way_and_answered_requests_never_do():
    k = Kicks()
    slots = ConnectionSlots(total=3, per_uid=3)
    a1 = slots.admit(1000, k.of("a1"))
    b1 = slots.admit(0, k.of("b1"))
    a2 = slots.admit(1000, k.of("a2"))
    assert a1 and b1 and a2
    assert slots.request_read(a1)  # a1's request is complete: its handler runs
    new = slots.admit(0, k.of("new"))
    # b1 is older, but uid 1000 holds more; of its readers a2 is the only one (a1 is answered).
    assert new is not None and k.kicked == ["a2"] and not b1.evicted and not a1.evicted


def test_busy_when_every_candidate_is_being_answered():
    k = Kicks()
    slots = ConnectionSlots(total=2, per_uid=2)
    held: list[Slot] = []
    for _ in range(2):
        s = slots.admit(1000, k.of("x"))
        assert s is not None and slots.request_read(s)
        held.append(s)
    assert slots.admit(1000, k.of("new")) is None and k.kicked == []
    slots.release(held[0])
    assert slots.admit(1000, k.of("new")) is not None and slots.evictions == 0


def test_a_kick_that_fails_still_frees_the_slot():
    def gone() -> None:
        raise OSError("peer gone")

    slots = ConnectionSlots(total=1, per_uid=1)
    old = slots.admit(5, gone)
    assert old is not None and slots.admit(5, lambda: None) is not None and old.evicted


def test_bounds_below_one_are_refused():
    with pytest.raises(ValueError, match="at least 1"):
        ConnectionSlots(total=0, per_uid=1)
