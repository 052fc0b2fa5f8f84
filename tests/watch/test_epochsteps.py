"""Epoch-local counters become global steps (supervisor/watch/epochsteps.py), through the real
parser, LogWatcher and NaN detector: the onset a rollback reads and the steps validation compares."""
from __future__ import annotations

from supervisor.events import Cause
from supervisor.core.observations import Detection, MetricRecord
from supervisor.watch.config import DetectorsConfig
from supervisor.watch.epochsteps import MAX_SOURCES, EpochSteps
from supervisor.watch.logwatch import LogWatcher
from supervisor.watch.parsers import MetricParser


def watch() -> tuple[LogWatcher, list[Detection], list[MetricRecord]]:
    dets: list[Detection] = []
    recs: list[MetricRecord] = []
    w = LogWatcher(DetectorsConfig(), dets.append, recs.append)
    w.reset(0, None)
    return w, dets, recs


def epochs(first: int, last: int, per_epoch: int, every: int, fmt: str, *, global_cadence: bool = False,
           base: int = 0) -> list[str]:
    """The lines of a loop with ``per_epoch`` iterations an epoch, printing every ``every`` iterations
    (of the epoch; of the run with ``global_cadence``), counters from ``base``."""
    out = []
    for g in range(first, last):
        e, i = divmod(g, per_epoch)
        if (g if global_cadence else i) % every == 0:
            out.append(fmt.format(e=e, i=i + base, loss="2.0"))
    return out


def test_the_issue_s_case_epoch_1_iter_50_is_step_150_and_the_onset_follows_the_last_finite_step() -> None:
    # 100 iterations an epoch, `iter` back at 0 every epoch, a print every iteration.
    w, dets, recs = watch()
    w.feed("stdout", epochs(0, 150, 100, 1, "epoch {e} | iter {i} | loss {loss}"))
    w.feed("stdout", ["epoch 1 | iter 50 | loss nan"])
    assert [r.step for r in recs[98:102]] == [98, 99, 100, 101]
    [d] = dets
    assert d.cause is Cause.NAN and d.step == 150 and d.onset_step == 150, d
    assert recs[-1].extra["step_from_epoch"] == 1.0 and recs[-1].extra["epoch_counter"] == 50.0


def test_a_printed_total_is_the_epoch_s_length() -> None:
    w, _, recs = watch()
    w.feed("stdout", epochs(0, 160, 100, 10, "epoch {e} | iter {i}/100 | loss {loss}"))
    assert [r.step for r in recs][-6:] == [100, 110, 120, 130, 140, 150]


def test_a_log_on_the_global_cadence_gives_the_exact_length_even_when_it_is_no_multiple() -> None:
    # 95 iterations an epoch, a print every 10 global steps: epoch 1 shows iter 5, 15, ...
    w, _, recs = watch()
    w.feed("stdout", epochs(0, 200, 95, 10, "epoch {e} | iter {i} | loss {loss}", global_cadence=True))
    assert [r.step for r in recs] == list(range(0, 200, 10))


def test_a_log_that_restarts_with_the_epoch_is_read_early_never_late() -> None:
    # 95 iterations an epoch, a print at iterations 0, 10, ... 90 of each epoch: the length is
    # somewhere in 91..100; the fewest (91) is taken, so a step is never past the real one.
    w, _, recs = watch()
    w.feed("stdout", epochs(0, 95 * 3, 95, 10, "epoch {e} | iter {i} | loss {loss}"))
    real = [e * 95 + i for e in range(3) for i in range(0, 95, 10)]
    got = [r.step for r in recs]
    assert None not in got and len(got) == len(real), got
    assert all(g <= r for g, r in zip(got, real) if g is not None), (got, real)
    assert (got[-1] or 0) >= real[-1] - 2 * 9  # early by at most (every - 1) per epoch


def test_one_based_counters_and_one_based_epochs() -> None:
    # "Epoch [1/10], Step [60/300]"-like loops count both from 1: epoch 1 is the first.
    w, _, recs = watch()
    w.feed("stdout", [f"epoch {e + 1} | iter {i + 1} | loss 2.0" for e in range(2) for i in range(100)])
    assert [r.step for r in recs][-3:] == [198, 199, 200] and recs[100].step == 101


def test_an_explicit_global_step_wins_over_the_iteration_of_the_epoch() -> None:
    p = MetricParser()
    for line in ("epoch 1 | iter 50 | step 150 | loss nan", "epoch 1 | global_step 150 | iter 50 | loss nan"):
        rec = p.parse(line, "stdout")
        assert rec is not None and rec.step == 150 and "epoch_counter" not in rec.extra, (line, rec)
    w, _, recs = watch()
    w.feed("stdout", ["epoch 0 | iter 90 | step 90 | loss 2.0", "epoch 1 | iter 0 | step 100 | loss 2.0"])
    assert [r.step for r in recs] == [90, 100]


def test_a_counter_that_goes_on_counting_across_epochs_is_kept_as_printed() -> None:
    # tests/trainer_scripts/loop_logging_train.py's default: "epoch 1 | iter 110/300" is step 110.
    w, _, recs = watch()
    w.feed("stdout", [f"epoch {(g - 1) // 100} | iter {g}/300 | loss 2.0" for g in range(10, 260, 10)])
    assert [r.step for r in recs] == list(range(10, 260, 10))


def test_what_was_learned_carries_into_a_resumed_attempt_that_sees_no_wrap() -> None:
    w, dets, recs = watch()
    w.feed("stdout", epochs(0, 150, 100, 10, "epoch {e} | iter {i}/100 | loss {loss}"))
    w.reset(1, 140)
    w.feed("stdout", ["epoch 1 | iter 50/100 | loss 2.0", "epoch 1 | iter 60/100 | loss nan"])
    assert [r.step for r in recs[-2:]] == [150, 160]
    [d] = dets
    assert d.step == 160 and d.onset_step == 151, d


def test_before_any_wrap_a_later_epoch_s_counter_is_no_step() -> None:
    # A source first seen in a resumed attempt: which epoch counts from 0 is unknown, and so is the
    # epoch's length; the record keeps no step (a NaN's onset is the watcher's last known step).
    w, dets, recs = watch()
    w.reset(1, 140)
    w.feed("stdout", ["step 140 | loss 2.0", "epoch 1 | iter 50 | loss nan"])
    assert recs[-1].step is None and "step_from_epoch" not in recs[-1].extra
    assert dets and dets[0].step == 140, dets
    # A log sparser than an epoch (one record each) proves nothing either way.
    w2, _, recs2 = watch()
    w2.feed("stdout", ["epoch 0 | iter 50 | loss 2.0", "epoch 1 | iter 60 | loss 2.0"])
    assert [r.step for r in recs2] == [50, None]


def test_lightning_s_bar_counts_the_epoch_s_batches() -> None:
    w, dets, recs = watch()
    bar = "Epoch {e}:  50%|#####     | {n}/100 [00:01<00:01, 50.0it/s, v_num=0, train_loss={loss}]"
    w.feed("stderr", [bar.format(e=0, n=99, loss="2.00"), bar.format(e=1, n=49, loss="2.00"),
                      bar.format(e=1, n=50, loss="nan.0")])
    assert [r.step for r in recs] == [99, 149, 150]
    assert dets and dets[0].step == 150


def test_sources_are_bounded() -> None:
    es = EpochSteps()
    rec = MetricRecord(step=5, loss=1.0, fmt="generic", extra={"epoch": 0.0, "epoch_counter": 5.0}, at=0.0)
    for i in range(MAX_SOURCES * 3):
        assert es.globalize(f"file:{i}", rec).step == 5
    assert len(es._by) == MAX_SOURCES
    odd = MetricRecord(step=5, loss=1.0, fmt="generic", extra={"epoch": 0.5, "epoch_counter": 5.0}, at=0.0)
    assert es.globalize("x", odd) is odd  # a fractional epoch (HF's) is no epoch index


def test_a_crafted_epoch_makes_no_giant_step() -> None:
    w, _, recs = watch()
    w.feed("stdout", [f"epoch {e} | iter {i}/100 | loss 2.0" for e in (0, 1) for i in (10, 90)])
    w.feed("stdout", ["epoch 100000000000000000 | iter 5/100 | loss 2.0", "epoch 1e300 | iter 5/100 | loss 2.0"])
    assert [r.step for r in recs] == [10, 90, 110, 190, None, None]


def test_json_lines_and_jsonl_files_with_an_epoch_and_an_iter() -> None:
    w, dets, recs = watch()
    w.feed("stdout", [f'{{"epoch": {e}, "iter": {i}, "loss": 2.0}}' for e in (0, 1) for i in range(0, 100, 10)])
    assert [r.step for r in recs][9:12] == [90, 91, 101]  # 0..90 logged: at least 91 an epoch
    w.feed("stdout", ['{"epoch": 1, "iter": 50, "step": 150, "loss": 2.0}'])  # an explicit step wins
    assert recs[-1].step == 150 and "epoch_counter" not in recs[-1].extra
    # The same records read from a metric file the job writes (feed_records: JSONL, CSV, TensorBoard).
    from supervisor.watch.parsers import MetricParser
    p = MetricParser()
    lines = [f'{{"epoch": {e}, "iteration": {i}, "loss": {"NaN" if (e, i) == (1, 60) else 2.0}}}'
             for e in (0, 1) for i in range(0, 100, 20)] + ['{"epoch": 1, "iteration": 60, "loss": NaN}']
    file_recs = [r for r in (p.parse(x, "file:/run/m.jsonl") for x in lines) if r is not None]
    w2, dets2, recs2 = watch()
    w2.feed_records("file:/run/m.jsonl", file_recs)
    assert [r.step for r in recs2][4:6] == [80, 81] and recs2[-1].step == 141
    assert dets2 and dets2[0].step == 141


def test_a_real_lightning_bar_captured_into_a_pipe_gives_global_steps_and_the_real_onset() -> None:
    # tests/corpus/pl_train_loss.stdout (Lightning 2.6, 10 batches an epoch, 3 epochs, NaN weights
    # after batch 17), each redraw of the bar a line: "Epoch 1:  80%|...| 8/10 [..., train_loss=nan.0]"
    # is step 18, where the NaN really is (read as the bar's 8 it was 10 steps early, and stepless
    # before: the onset was the last step some other line printed).
    from pathlib import Path

    w, dets, recs = watch()
    text = (Path(__file__).parents[1] / "corpus" / "pl_train_loss.stdout").read_text(errors="replace")
    w.feed("stdout", text.splitlines())
    bars = [r for r in recs if r.fmt == "lightning"]
    # A bar at 0/10 ("Epoch 0: 0%" redrawn as epoch 1 starts, under the old name) has done nothing: no step.
    assert all(r.step is not None or r.extra["batch"] == 0 for r in bars), bars
    steps = [r.step for r in bars if r.step is not None]
    assert steps == sorted(steps) and steps[-1] == 30, steps
    [d] = dets
    assert d.cause is Cause.NAN and d.step == 18 and d.onset_step == 18, d
