"""A NaN judged ahead of the in-order parsing (watch/nanahead.py, LogWatcher.feed_ahead): the same
detection the in-order NaN detector gives, or none when it cannot be sure; one nan per attempt."""
from __future__ import annotations

from supervisor.core.observations import Detection
from supervisor.watch.config import DetectorsConfig
from supervisor.watch.logwatch import LogWatcher
from supervisor.watch.nanahead import NanAhead

WINDOW = ["iter 98: loss 2.1000, time 12.34ms, mfu 1.20%", "iter 99: loss 2.2000, time 12.34ms, mfu 1.20%",
          "iter 100: loss nan, time 12.34ms, mfu 1.20%"]


def in_order(lines: list[str]) -> Detection:
    got: list[Detection] = []
    w = LogWatcher(DetectorsConfig(), got.append, lambda rec: None)
    w.reset(0, None)
    w.feed("stdout", lines)
    [det] = got
    return det


def test_the_detection_is_the_in_order_one_marked_as_found_ahead() -> None:
    ahead = NanAhead(DetectorsConfig()).judge("stdout", WINDOW)
    want = in_order(WINDOW)
    assert ahead is not None and ahead.details == {**want.details, "found_ahead_of_parsing": True}
    assert (ahead.cause, ahead.step, ahead.onset_step, ahead.summary, ahead.evidence, ahead.source) == \
        (want.cause, want.step, want.onset_step, want.summary, want.evidence, want.source)


def test_without_a_finite_record_before_it_the_onset_is_unknown_so_none() -> None:
    assert NanAhead(DetectorsConfig()).judge("stdout", WINDOW[2:]) is None
    assert NanAhead(DetectorsConfig()).judge("stdout", ["loss is nan? no", "Detected inf in grads"]) is None


def test_a_record_whose_step_the_watcher_makes_is_left_to_the_in_order_path() -> None:
    hf = ["{'loss': '2.1', 'grad_norm': '1.5', 'learning_rate': '4e-05', 'epoch': '0.1'}",
          "{'loss': 'nan', 'grad_norm': '1.5', 'learning_rate': '4e-05', 'epoch': '0.2'}"]
    assert NanAhead(DetectorsConfig()).judge("stdout", hf) is None


def test_the_watcher_keeps_one_nan_per_attempt_whichever_path_saw_it_first() -> None:
    got: list[Detection] = []
    w = LogWatcher(DetectorsConfig(), got.append, lambda rec: None)
    w.reset(0, None)
    w.feed_ahead("stdout", WINDOW)
    w.feed("stdout", WINDOW)  # the same lines, now in order
    w.feed_ahead("stdout", WINDOW)
    assert [(d.cause.value, d.step, d.details.get("found_ahead_of_parsing")) for d in got] == [("nan", 100, True)]
    w.reset(1, None)  # the next attempt is judged afresh
    w.feed_ahead("stdout", WINDOW)
    assert len(got) == 2
