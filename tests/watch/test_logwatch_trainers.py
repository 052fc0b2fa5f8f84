"""The log watcher on real captured trainer output (tests/corpus), delivered as the pumps deliver
it: bytes through the one LineSplitter, in chunks, into a LogWatcher with every detector on."""
from __future__ import annotations

import json
from pathlib import Path

from supervisor.events import Cause
from supervisor.core.observations import Detection, MetricRecord
from supervisor.job.linesplit import LineSplitter
from supervisor.watch.config import DetectorsConfig
from supervisor.watch.logwatch import LogWatcher

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
MANIFEST = json.loads((CORPUS / "manifest.json").read_text())


class Steps:
    def __init__(self) -> None:
        self.steps: list[int | None] = []
        self.lines = 0

    def note_output(self, now: float, line: str | None = None) -> None:
        self.lines += 1

    def note_step(self, now: float, step: int | None, origin: str = "", lag: float = 0.0) -> None:
        self.steps.append(step)


def replay(name: str, chunk: int = 777, resume_step: int | None = None
           ) -> tuple[list[MetricRecord], list[Detection], Steps]:
    recs: list[MetricRecord] = []
    dets: list[Detection] = []
    progress = Steps()
    w = LogWatcher(DetectorsConfig(), dets.append, recs.append, progress=progress, clock=lambda: 0.0)
    w.reset(0, resume_step)
    data = (CORPUS / name).read_bytes()
    sp = LineSplitter()
    for i in range(0, len(data), chunk):
        w.feed("stdout", sp.push(data[i:i + chunk]))
    w.feed("stdout", sp.flush())
    return recs, dets, progress


def test_hf5_dicts_get_the_bar_step_and_the_nan_its_onset() -> None:
    p = MANIFEST["hf5_filter_on"]["params"]
    recs, dets, progress = replay("hf5_filter_on.merged")
    train = [r for r in recs if r.fmt == "hf" and r.loss is not None]
    every = p["logging_steps"]
    assert [r.step for r in train] == list(range(every, p["max_steps"] + 1, every))
    assert all(r.extra.get("step_from_bar") for r in train)
    evals = [r for r in recs if r.val_loss is not None]
    assert [r.step for r in evals] == list(range(p["eval_steps"], p["max_steps"] + 1, p["eval_steps"]))
    # The filter keeps the printed loss finite; the grad norm after the poisoned step is not.
    assert [d.cause for d in dets] == [Cause.NAN]
    first_bad = (p["nan_step"] // every + 1) * every
    assert dets[0].step == first_bad and dets[0].onset_step == first_bad - every + 1
    assert dets[0].details["field"] == "grad_norm"
    # Liveness saw every step the bar drew, in order, once.
    new = [s for s in progress.steps if s is not None]
    assert new == sorted(set(new)) and new[-1] == p["max_steps"]


def test_hf5_resume_bar_starts_at_the_resumed_step() -> None:
    p = MANIFEST["hf5_resume"]["params"]
    recs, dets, progress = replay("hf5_resume.merged", chunk=64, resume_step=p["resume_from"])
    assert dets == []  # the tied-weights "missing keys" line of every resume is no load error
    train = [r for r in recs if r.fmt == "hf" and r.loss is not None]
    every = p["logging_steps"]
    true = list(range(p["resume_from"] + every, p["max_steps"] + 1, every))
    # This capture ran at ~85 steps/s, faster than tqdm redraws (0.1 s): a dict takes the bar's
    # last drawn position, at most one logging interval early and never late (the safe side for
    # an onset). At real step times (> 0.1 s) every step is drawn and the label is exact.
    assert all(r.step is not None for r in train)
    got = [r.step for r in train if r.step is not None]
    assert len(got) == len(true) and got == sorted(got)
    assert all(t - every < g <= t for g, t in zip(got, true)), (got, true)
    assert min(s for s in progress.steps if s is not None) > p["resume_from"]


def test_hf4_numbers_and_nan_filter_off() -> None:
    p = MANIFEST["hf4_filter_off"]["params"]
    recs, dets, _ = replay("hf4_filter_off.merged")
    assert [d.cause for d in dets] == [Cause.NAN]
    assert dets[0].details["field"] in ("loss", "grad_norm")
    assert dets[0].step is not None and dets[0].step > p["nan_step"]
