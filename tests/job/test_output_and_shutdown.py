"""Line splitting and the shutdown state machine, with a fake group and a fake clock."""
from __future__ import annotations

import signal

from supervisor.job.linesplit import MAX_LINE, TRUNCATED_MARKER, LineSplitter
from supervisor.daemon.jobstop import Mode, Phase, Shutdown, ShutdownPlan


def test_partial_lines_are_held_until_complete():
    s = LineSplitter()
    assert s.push(b"abc") == []
    assert s.push(b"def\nghi") == ["abcdef"]
    assert s.push(b"\n\n") == ["ghi", ""]
    assert s.flush() == []
    assert s.push(b"tail") == [] and s.flush() == ["tail"]


def test_invalid_utf8_is_replaced_not_fatal():
    s = LineSplitter()
    out = s.push(b"loss \xff\xfe 2.0\n")
    assert out == ["loss \ufffd\ufffd 2.0"]
    # A multi-byte character split across chunks decodes whole.
    e = "é".encode()
    assert s.push(b"caf" + e[:1]) == [] and s.push(e[1:] + b"\n") == ["café"]


def test_huge_line_costs_bounded_memory():
    s = LineSplitter()
    out = []
    for _ in range(200):  # 12.8 MB without a newline
        out += s.push(b"x" * 65536)
        assert s.pending <= MAX_LINE
    out += s.push(b"end\nnext\n")
    assert len(out) == 2 and out[0].endswith(TRUNCATED_MARKER) and len(out[0]) < MAX_LINE + 100
    assert out[1] == "next"
    assert s.truncated == 1 and s.pending == 0


def test_carriage_returns_are_dropped_at_line_ends():
    s = LineSplitter()
    assert s.push(b"step 1 loss 2.0\r\nstep 2\r\n") == ["step 1 loss 2.0", "step 2"]


class FakeGroup:
    def __init__(self, dies_on=()):
        self.sent: list[int] = []
        self.alive = True
        self.dies_on = set(dies_on) | {signal.SIGKILL}

    def signal_group(self, sig: int) -> None:
        self.sent.append(sig)
        if sig in self.dies_on:
            self.alive = False

    def group_alive(self) -> bool:
        return self.alive


def test_graceful_escalates_to_sigkill_after_grace():
    g = FakeGroup(dies_on=())
    sd = Shutdown(ShutdownPlan(Mode.GRACEFUL, grace_s=5), g, now=100.0)
    assert g.sent == [signal.SIGTERM] and sd.phase is Phase.TERM_WAIT
    assert not sd.poll(104.9) and g.sent == [signal.SIGTERM]
    sd.poll(105.0)
    assert g.sent == [signal.SIGTERM, signal.SIGKILL]
    assert sd.poll(105.1) and sd.result(105.1).escalated


def test_graceful_job_that_exits_is_not_killed():
    g = FakeGroup(dies_on=(signal.SIGTERM,))
    sd = Shutdown(ShutdownPlan(Mode.GRACEFUL, grace_s=5), g, now=0.0)
    assert sd.poll(0.1) and g.sent == [signal.SIGTERM] and not sd.result(0.1).escalated


def test_forced_kills_at_once():
    g = FakeGroup()
    sd = Shutdown(ShutdownPlan(Mode.FORCED, grace_s=5), g, now=0.0)
    assert g.sent == [signal.SIGKILL] and sd.poll(0.0)


def test_hybrid_waits_for_checkpoint_then_stops():
    g = FakeGroup(dies_on=(signal.SIGTERM,))
    seen = {"ckpt": False}
    sd = Shutdown(ShutdownPlan(Mode.HYBRID, grace_s=5, checkpoint_timeout_s=30), g, now=0.0,
                  new_checkpoint=lambda: seen["ckpt"])
    assert g.sent == [signal.SIGUSR1] and sd.phase is Phase.CHECKPOINT_WAIT
    assert not sd.poll(10.0) and g.sent == [signal.SIGUSR1]
    seen["ckpt"] = True
    sd.poll(11.0)
    assert g.sent == [signal.SIGUSR1, signal.SIGTERM]
    assert sd.poll(11.1) and sd.result(11.1).checkpoint_seen is True


def test_hybrid_checkpoint_timeout_then_graceful():
    g = FakeGroup()
    sd = Shutdown(ShutdownPlan(Mode.HYBRID, grace_s=5, checkpoint_timeout_s=30), g, now=0.0,
                  new_checkpoint=lambda: False)
    sd.poll(30.0)
    assert g.sent == [signal.SIGUSR1, signal.SIGTERM]
    sd.poll(35.0)
    assert g.sent[-1] == signal.SIGKILL and sd.result(35.0).checkpoint_seen is False


def test_second_request_escalates():
    g = FakeGroup()
    sd = Shutdown(ShutdownPlan(Mode.GRACEFUL, grace_s=100), g, now=0.0)
    sd.escalate(1.0)
    assert g.sent == [signal.SIGTERM, signal.SIGKILL] and sd.poll(1.0)


def test_stragglers_reported_after_kill_wait():
    class Immortal(FakeGroup):
        def signal_group(self, sig):
            self.sent.append(sig)

    g = Immortal()
    sd = Shutdown(ShutdownPlan(Mode.FORCED, grace_s=1, kill_wait_s=3), g, now=0.0)
    assert not sd.poll(2.0)
    assert sd.poll(3.0) and sd.result(3.0).stragglers
