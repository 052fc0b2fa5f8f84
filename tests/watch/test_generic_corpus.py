"""The generic parser and the tqdm bar's step on captured real output of the two plain PyTorch loops
(tests/trainer_scripts/loop_logging_train.py, loop_tqdm_train.py; captured by tests/corpus/capture.py
``--only jobs`` with a NaN injected), and the onset the real LogWatcher books from them."""
from __future__ import annotations

import math

import pytest

from supervisor.events import Cause
from supervisor.core.observations import Detection, MetricRecord
from supervisor.watch.config import DetectorsConfig
from supervisor.watch.logwatch import LogWatcher
from tests.watch.test_parsers_corpus import CORPUS, MANIFEST, parse_file, segments


def params(run: str) -> dict:
    return MANIFEST[run]["params"]


def watched(name: str, source: str) -> tuple[list[Detection], list[MetricRecord]]:
    dets: list[Detection] = []
    recs: list[MetricRecord] = []
    w = LogWatcher(DetectorsConfig(), dets.append, recs.append)
    segs = segments(CORPUS / name)
    for i in range(0, len(segs), 7):  # batches, as a pipe reader hands them over
        w.feed(source, segs[i:i + 7])
    return dets, recs


@pytest.mark.parametrize("stream", ["stderr", "merged"])
def test_logging_loop_every_logged_iter_is_a_generic_record_with_its_step(stream: str) -> None:
    p = params("loop_logging")
    out = parse_file(f"loop_logging.{stream}")
    recs = [r for _, r in out if r is not None]
    assert all(r.fmt == "generic" for r in recs), {r.fmt for r in recs}
    assert [r.step for r in recs] == list(range(p["log_every"], p["steps"] + 1, p["log_every"]))
    for r in recs:
        assert r.lr == 0.05 and r.extra["total"] == p["steps"]
        # The weights are NaN after step nan_step: every later print is NaN, every earlier one finite.
        assert (r.loss is not None and math.isnan(r.loss)) == (r.step is not None and r.step > p["nan_step"]), r
    others = [seg for seg, r in out if r is None]
    assert others and all("saved checkpoint" in s or "finished" in s or "not finite" in s for s in others), others
    assert parse_file("loop_logging.stdout") == []


def test_logging_loop_nan_onset_is_after_the_last_finite_print() -> None:
    p = params("loop_logging")
    dets, _ = watched("loop_logging.stderr", "stderr")
    [d] = dets
    first_nan = (p["nan_step"] // p["log_every"] + 1) * p["log_every"]
    assert d.cause is Cause.NAN and d.step == first_nan and d.onset_step == first_nan - p["log_every"] + 1


@pytest.mark.parametrize("stream", ["stderr", "merged"])
def test_tqdm_loop_bar_records_carry_the_counter_as_step(stream: str) -> None:
    p = params("loop_tqdm")
    recs = [r for _, r in parse_file(f"loop_tqdm.{stream}") if r is not None]
    assert recs and all(r.fmt == "tqdm" for r in recs), {r.fmt for r in recs}
    assert all(r.step is not None for r in recs)
    steps = [r.step for r in recs if r.step is not None]
    assert steps == sorted(steps) and steps[-1] == p["steps"] and all(r.extra["total"] == p["steps"] for r in recs)
    # The loss beside counter c is that of step index >= c (tqdm redraws on set_postfix with the count
    # it last displayed): the first NaN is shown at or before index nan_step + 1, never after it.
    first_nan = next(r for r in recs if r.loss is not None and math.isnan(r.loss))
    assert first_nan.step is not None and first_nan.step <= p["nan_step"] + 1
    assert all(r.loss is not None and math.isnan(r.loss) for r in recs[recs.index(first_nan):])
    assert not [r for _, r in parse_file("loop_tqdm.stdout") if r is not None], "the 'saved ...' lines"


def test_tqdm_loop_nan_onset_is_the_bar_position_so_the_newest_checkpoint_before_it_is_good() -> None:
    p = params("loop_tqdm")
    dets, _ = watched("loop_tqdm.stderr", "stderr")
    [d] = dets
    assert d.cause is Cause.NAN and d.onset_step is not None
    # The poison starts at step index nan_step + 1; the checkpoint of save_every * k steps holds
    # indices < save_every * k. The onset is at most the real one, and past the last good save.
    newest_good = (p["nan_step"] + 1) // p["save_every"] * p["save_every"]
    assert newest_good < d.onset_step <= p["nan_step"] + 1, d
