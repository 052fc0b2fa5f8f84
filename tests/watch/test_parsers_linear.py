"""Every log-line parser and text rule does work linear in the line length, and one bad record
loses only itself (issue 24, build 5).

Linearity is judged by ratio, never by an absolute time: for each crafted line of
tests/watch/crafted.py, the time per character at 4 kB, 16 kB and 64 kB. Linear work takes 4x the
time for 4x the line; a backtracking regex that rescans the line from many places takes 16x (the
torchtitan regex once took 1.45 s for one crafted 4 kB line). Each figure is the best of 5 rounds
with the same number of characters per round, so a busy neighbour inflates a round, not the ratio.
"""
from __future__ import annotations

import json
import time

import pytest

from supervisor.events import Cause
from supervisor.core.observations import Detection, MetricRecord
from supervisor.watch.config import DetectorsConfig
from supervisor.watch.logwatch import LogWatcher
from supervisor.watch.parsers import MetricParser

from .crafted import CRAFTED, parse_all

SIZES = (4096, 16384, 65536)
# Judged from the shortest line to the longest (16x the characters): linear work takes 16x the
# time, quadratic 256x. 100x leaves room for caches and a loaded machine (a 4x step was judged
# alone before and failed on noise: 18.6x for one step on a busy 2-core CI run; 64x failed once at
# 68x for a line that costs 11x here when quiet).
MAX_RATIO = 100.0


def _costs(parser: MetricParser, lines: list[str]) -> list[float]:
    """The best time per call of each line, the sizes measured in turn within each round, so a
    busy stretch of the machine falls on every size alike rather than on one."""
    best = [float("inf")] * len(lines)
    for _ in range(9):
        for k, line in enumerate(lines):
            calls = max(SIZES) // len(line) or 1
            t0 = time.perf_counter()
            for _ in range(calls):
                parse_all(parser, line)
            best[k] = min(best[k], (time.perf_counter() - t0) / calls)
    return best


@pytest.mark.parametrize("fmt,i", [(f, i) for f, builds in CRAFTED.items() for i in range(len(builds))])
def test_crafted_line_costs_time_linear_in_its_length(fmt: str, i: int) -> None:
    build = CRAFTED[fmt][i]
    parser = MetricParser(max_line_chars=max(SIZES) * 2)  # the daemon's 4 kB cap lifted: the regexes alone
    lines = [build(n) for n in SIZES]
    assert all(abs(len(line) - n) < 64 for line, n in zip(lines, SIZES))
    costs = _costs(parser, lines)
    ratio = costs[-1] / max(costs[0], 1e-9)
    assert ratio < MAX_RATIO, (
        f"{fmt} line {build(60)!r}...: {max(SIZES)} chars cost {ratio:.1f}x the time of a line 16x shorter "
        f"(linear is 16x, quadratic 256x): {[f'{c * 1e3:.2f} ms' for c in costs]}")


def _watch() -> tuple[LogWatcher, list[Detection], list[MetricRecord]]:
    dets: list[Detection] = []
    recs: list[MetricRecord] = []
    return LogWatcher(DetectorsConfig(), dets.append, recs.append, clock=lambda: 0.0), dets, recs


def test_json_integer_beyond_float_range_is_not_finite_and_the_batch_still_judged() -> None:
    w, dets, recs = _watch()
    huge = "9" * 400  # above 1e308: float() raises OverflowError on it
    w.feed("stdout", [json.dumps({"step": 1, "loss": 2.5}),
                      '{"step": 2, "loss": ' + huge + "}",
                      '{"step": 3, "loss": 2.4, "tokens": ' + huge + "}",
                      json.dumps({"step": 4, "loss": float("nan")})])
    assert [r.step for r in recs] == [1, 2, 3, 4]
    assert recs[1].loss == float("inf") and recs[2].extra["tokens"] == float("inf")
    assert [d.cause for d in dets] == [Cause.NAN] and dets[0].step == 2


def test_a_line_that_breaks_the_parser_loses_only_itself() -> None:
    """A record no parser can take (nesting deeper than the JSON decoder goes; a parser that raises)
    is skipped alone: the NaN line after it in the same batch is still detected."""
    w, dets, recs = _watch()
    deep = '{"a": ' + "[" * 2000 + "]" * 2000 + "}"
    boom = "step 7 loss 1.5 BOOM"
    original = w._parser.parse

    def parse(line: str, source: str = "") -> MetricRecord | None:
        if "BOOM" in line:
            raise RuntimeError("a parser bug on this one line")
        return original(line, source)

    w._parser.parse = parse  # type: ignore[method-assign]
    w.feed("stdout", [json.dumps({"step": 5, "loss": 2.0}), deep, boom, "iter 8: loss nan, time 12.0ms"])
    assert [r.step for r in recs] == [5, 8]
    assert [d.cause for d in dets] == [Cause.NAN] and dets[0].step == 8
