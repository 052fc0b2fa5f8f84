"""The parsers against captured real output (tests/corpus/, see its README.md).

Each file is split on ``\\r`` and ``\\n`` as the log watcher does, every segment is parsed, and the
records are checked against what the capture did (manifest.json: steps, logging interval, the step
after which the parameters were filled with NaN, ...), not against copied numbers.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from supervisor.core.observations import MetricRecord
from supervisor.watch.parsers import METRIC_KEYWORDS, MetricParser
from tests.util import known

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
MANIFEST = json.loads((CORPUS / "manifest.json").read_text())


def segments(path: Path) -> list[str]:
    """The file as the log watcher sees it: split on \\r\\n, \\r and \\n; blank segments dropped."""
    text = path.read_bytes().decode("utf-8", "replace")
    return [s for s in re.split(r"\r\n|\r|\n", text) if s.strip()]


def parse_file(name: str, source: str = "stdout") -> list[tuple[str, MetricRecord | None]]:
    """(segment, record) for every segment. Also checks the prefilter never hides a metric line."""
    p = MetricParser()
    out = []
    for seg in segments(CORPUS / name):
        passes = p.wants_all_lines(source) or any(k in seg for k in METRIC_KEYWORDS)
        rec = p.parse(seg, source)
        if rec is not None:
            assert passes, f"prefilter would drop a metric line: {seg!r}"
            assert rec.source == source
        out.append((seg, rec))
    return out


def records(name: str, fmt: str | None = None, source: str = "stdout") -> list[MetricRecord]:
    return [r for _, r in parse_file(name, source) if r is not None and (fmt is None or r.fmt == fmt)]


def finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def nonfinite(x: float | None) -> bool:
    return x is not None and not math.isfinite(x)


def params(run: str) -> dict:
    return MANIFEST[run]["params"]


# ---------------------------------------------------------------------------------------------------- HF

HF_DICT_RUNS = [(run, stream) for run in ("hf5_filter_on", "hf5_filter_off", "hf5_printer", "hf5_logprefix",
                                          "hf4_filter_on", "hf4_filter_off")
                for stream in ("stdout", "merged")]


def hf_train_eval(run: str, stream: str) -> tuple[list[MetricRecord], list[MetricRecord]]:
    recs = records(f"{run}.{stream}", "hf")
    assert all(r.step is None for r in recs)  # HF never prints the step
    train = [r for r in recs if r.loss is not None]
    evals = [r for r in recs if r.val_loss is not None]
    assert len(train) + len(evals) == len(recs)
    if run.endswith("logprefix"):
        # Every log event is printed twice: by the ProgressCallback and by the callback through the
        # logger (raw floats behind "%(asctime)s - INFO - __main__ - "). Keep one of each pair.
        assert len(train) % 2 == 0 and len(evals) % 2 == 0
        for a, b in zip(train[::2], train[1::2]):
            assert a.loss == pytest.approx(b.loss, rel=1e-3, abs=1e-12)
        train, evals = train[1::2], evals[1::2]
    return train, evals


@pytest.mark.parametrize("run,stream", HF_DICT_RUNS)
def test_hf_train_dicts(run: str, stream: str) -> None:
    p = params(run)
    train, _ = hf_train_eval(run, stream)
    steps = list(range(p["logging_steps"], p["max_steps"] + 1, p["logging_steps"]))
    assert len(train) == len(steps)
    filtered = "filter_off" not in run  # logging_nan_inf_filter defaults to on
    for step, r in zip(steps, train):
        assert r.extra["epoch"] == pytest.approx(step / p["max_steps"], abs=0.005)  # 4.x rounds to 2 places
        assert finite(r.lr)
        if step <= p["nan_step"]:
            assert finite(r.loss) and finite(r.grad_norm) and known(r.loss) > 0
        else:
            # The parameters are NaN from step nan_step + 1 on: every later grad norm is NaN.
            assert nonfinite(r.grad_norm), (step, r)
            if not filtered:
                assert nonfinite(r.loss), (step, r)
            elif step - p["logging_steps"] >= p["nan_step"]:
                assert r.loss == 0.0  # the filter replaced every step of the interval: HF logs 0
            else:
                assert finite(r.loss) and known(r.loss) > 0  # the mean of the finite steps of the interval


@pytest.mark.parametrize("run,stream", HF_DICT_RUNS)
def test_hf_eval_dicts_and_summary(run: str, stream: str) -> None:
    p = params(run)
    _, evals = hf_train_eval(run, stream)
    steps = list(range(p["eval_steps"], p["max_steps"] + 1, p["eval_steps"]))
    assert len(evals) == len(steps)
    for step, r in zip(steps, evals):
        assert r.loss is None and "eval_runtime" in r.extra
        assert (nonfinite if step > p["nan_step"] else finite)(r.val_loss), (step, r)
    parsed = parse_file(f"{run}.{stream}")
    summaries = [(s, r) for s, r in parsed if "'train_runtime'" in s]
    assert summaries and all(r is None for _, r in summaries)  # the final summary is not a step


@pytest.mark.parametrize("run", ["hf5_filter_on", "hf5_filter_off", "hf5_logprefix",
                                 "hf4_filter_on", "hf4_filter_off"])
def test_hf_training_bar_progress(run: str) -> None:
    p = params(run)
    for stream in ("stderr", "merged"):
        parsed = parse_file(f"{run}.{stream}")
        prog = [r for _, r in parsed if r is not None and r.fmt == "progress"]
        train = [r for r in prog if r.extra["total"] == p["max_steps"]]
        assert all(r.loss is None and r.grad_norm is None and set(r.extra) == {"total"} for r in prog)
        steps = [known(r.step) for r in train]
        assert steps == sorted(steps)  # the training bar never goes back
        # Each step takes longer than tqdm's mininterval (see capture.py), so every step is drawn.
        assert set(steps) == set(range(0, p["max_steps"] + 1))
        # Nested bars (eval during training: cursor-up ESC[A) and described bars give nothing.
        nested = [(s, r) for s, r in parsed if s.rstrip().endswith("\x1b[A") and "%|" in s]
        described = [(s, r) for s, r in parsed if s.lstrip().startswith("Writing model shards")]
        assert nested and (described or run.startswith("hf4"))  # 4.x saves without a bar
        assert all(r is None for _, r in nested + described)
        if run.endswith(("filter_on", "filter_off")):
            # The standalone trainer.evaluate() after training: its bar is the only bar left, neither
            # nested nor described. It is a progress record too; its total tells it apart.
            tail = [r for r in prog if r.extra["total"] != p["max_steps"]]
            n_eval_batches = math.ceil(p["eval_samples"] / p["batch_size"])
            assert tail and all(r.extra["total"] == n_eval_batches for r in tail)
            assert prog[-len(tail):] == tail
    # The bar is on stderr: stdout has no progress.
    assert not records(f"{run}.stdout", "progress")


@pytest.mark.parametrize("run", ["hf5_filter_on", "hf4_filter_off"])
def test_hf_merged_dict_follows_its_steps_bar(run: str) -> None:
    """In the merged stream the bar is redrawn at the dict's step before tqdm.write prints the dict:
    the last progress record before an HF train dict carries that dict's step (the log watcher's
    pairing). The dict may also sit behind the bar's \\r on the same physical line."""
    p = params(run)
    last_step = None
    paired = []
    for _, r in parse_file(f"{run}.merged"):
        if r is None:
            continue
        if r.fmt == "progress":
            last_step = r.step
        elif r.fmt == "hf" and r.loss is not None:
            paired.append(last_step)
    assert paired == list(range(p["logging_steps"], p["max_steps"] + 1, p["logging_steps"]))
    physical = (CORPUS / f"{run}.merged").read_bytes().decode().split("\n")
    behind_cr = [ln for ln in physical if "\r" in ln and ln.rstrip("\r").endswith("}") and "{'loss'" in ln]
    assert behind_cr
    p2 = MetricParser()
    for ln in behind_cr:  # a tailed file split on \n only: the line still holds the bar and its \r
        rec = p2.parse(ln, "file:train.log")
        assert rec is not None and rec.fmt == "hf" and rec.loss is not None


@pytest.mark.parametrize("run", ["hf5_resume", "hf4_resume"])
def test_hf_resume(run: str) -> None:
    p = params(run)
    train = records(f"{run}.stdout", "hf")
    assert len(train) == (p["max_steps"] - p["resume_from"]) // p["logging_steps"]
    assert all(finite(r.loss) and finite(r.grad_norm) for r in train)
    assert [r.extra["epoch"] for r in train] == pytest.approx(
        [s / p["max_steps"] for s in range(p["resume_from"] + p["logging_steps"], p["max_steps"] + 1,
                                            p["logging_steps"])], abs=1e-2)
    steps = [known(r.step) for r in records(f"{run}.stderr", "progress") if r.extra["total"] == p["max_steps"]]
    # The bar is created at 0 and jumps to the resumed global step at the first step end.
    assert steps[0] == 0 and steps[1] == p["resume_from"] + 1
    assert steps == sorted(steps) and steps[-1] == p["max_steps"]
    assert not any(0 < s <= p["resume_from"] for s in steps)


def test_hf_printer_callback_no_bars() -> None:
    # disable_tqdm=True: PrinterCallback prints the dicts; no training bar, no progress records.
    assert not records("hf5_printer.stderr", "progress") and not records("hf5_printer.merged", "progress")


# --------------------------------------------------------------------------------------------- Lightning

@pytest.mark.parametrize("run", ["pl_train_loss", "pl_loss"])
def test_lightning_bar_postfix(run: str) -> None:
    p = params(run)
    parsed = parse_file(f"{run}.stdout")  # Lightning's TQDM bars write to stdout
    recs = [r for _, r in parsed if r is not None]
    assert recs and all(r.fmt == "lightning" for r in recs)
    nan_from = p["nan_after_batches"]
    seen_val = False
    checked = {"finite": 0, "nan": 0}
    for r in recs:
        assert r.step is None  # not derivable from the bar (see parsers.py)
        assert r.extra["total"] == p["train_batches"]
        assert 0 <= r.extra["batch"] <= r.extra["total"] and 0 <= r.extra["epoch"] < p["max_epochs"]
        epoch, batch, total = int(r.extra["epoch"]), int(r.extra["batch"]), int(r.extra["total"])
        # The loss shown is that of a batch in [lo, hi] (1-based count over the run): the current batch,
        # or the previous one on the redraw that moves n before the postfix is updated; at n=0 (the
        # bar is reset at the end of an epoch, then renamed) the last batch of the epoch before or of
        # this one. Batches after nan_after_batches have a NaN loss.
        count = epoch * total + batch
        lo, hi = (epoch * total, (epoch + 1) * total) if batch == 0 else (count - 1, count)
        if hi <= nan_from:
            assert finite(r.loss), r
            checked["finite"] += 1
        elif lo > nan_from:
            assert nonfinite(r.loss), r
            checked["nan"] += 1
        if r.val_loss is not None:
            seen_val = True
    assert seen_val and nonfinite(recs[-1].val_loss)
    assert checked["finite"] >= nan_from and checked["nan"] >= p["train_batches"]
    # The stale first draw of each epoch, before the first batch, shows the last loss (count 10k+0).
    # Validation bars are nested; the sanity-check bar is described and has no metrics.
    nested = [r for s, r in parsed if s.startswith("Validation DataLoader") and "%|" in s]
    sanity = [r for s, r in parsed if s.startswith("Sanity Checking DataLoader")]
    assert nested and sanity and all(r is None for r in nested + sanity)


def test_lightning_nan_is_padded() -> None:
    # Lightning pads numbers to 5 characters: NaN prints as "nan.0".
    segs = [s for s in segments(CORPUS / "pl_train_loss.stdout") if "train_loss=nan.0" in s]
    assert segs
    rec = MetricParser().parse(segs[0])
    assert rec is not None and rec.loss is not None and math.isnan(rec.loss)


def test_lightning_csv_logger_rows() -> None:
    p = params("pl_train_loss")
    source = "file:/runs/lightning_logs/version_0/metrics.csv"
    parser = MetricParser()
    lines = (CORPUS / "pl_train_loss.metrics.csv").read_text().splitlines()
    assert not parser.wants_all_lines(source)
    assert parser.parse(lines[0], source) is None  # the header
    assert parser.wants_all_lines(source)
    recs = [known(parser.parse(ln, source)) for ln in lines[1:]]
    assert all(r.fmt == "csv" for r in recs)
    train = [r for r in recs if r.loss is not None]
    val = [r for r in recs if r.val_loss is not None]
    assert len(train) + len(val) == len(recs)
    total = p["train_batches"] * p["max_epochs"]
    every = p["log_every_n_steps"]
    # Lightning logs when (step + 1) % log_every_n_steps == 0; `step` is 0-based (4 = the 5th step).
    assert [r.step for r in train] == list(range(every - 1, total, every))
    for r in train:
        assert (nonfinite if known(r.step) + 1 > p["nan_after_batches"] else finite)(r.loss), r
        assert r.extra["epoch"] == known(r.step) // p["train_batches"]
    # One validation row per epoch, at its last step; NaN once the NaN batches were trained on.
    assert [r.step for r in val] == [(e + 1) * p["train_batches"] - 1 for e in range(p["max_epochs"])]
    for r in val:
        assert (nonfinite if known(r.step) + 1 > p["nan_after_batches"] else finite)(r.val_loss), r
    # Another source is not a CSV file; a stdout line is never taken for a header.
    assert parser.parse(lines[1], "file:/other.csv") is None
    assert parser.parse(lines[0], "stdout") is None and not parser.wants_all_lines("stdout")


def test_lightning_csv_header_change_and_set_header() -> None:
    parser = MetricParser()
    src = "file:/m.csv"
    assert parser.set_csv_header(src, "epoch,step,train_loss")
    r = parser.parse("0,4,2.5", src)
    assert r is not None and (r.step, r.loss) == (4, 2.5)
    # Lightning rewrites the file with a wider header when a new metric appears.
    assert parser.parse("epoch,lr-AdamW,step,train_loss_epoch,train_loss_step,val_loss", src) is None
    r = parser.parse("1,0.001,19,2.4,nan,", src)
    assert r is not None and r.step == 19 and math.isnan(known(r.loss)) and r.extra["train_loss_epoch"] == 2.4
    assert r.extra["lr-AdamW"] == 0.001 and r.val_loss is None
    assert parser.parse("1,2,3", src) is None  # wrong width: not a row
    assert not parser.set_csv_header(src, "a,b,c")  # no loss-like column: not a metrics header
    assert not parser.set_csv_header(src, "step, loss")  # spaces: prose, not a header


def test_lightning_rich_bar_is_not_parsed() -> None:
    # With `rich` installed Lightning picks RichProgressBar; on a pipe it renders once at the end,
    # wrapped over lines ("loss:" / "nan val_loss: nan"). Not a format we parse: no records.
    assert segments(CORPUS / "pl_rich.stdout")
    assert records("pl_rich.stdout") == [] and records("pl_rich.merged") == []


# ---------------------------------------------------------------------------------- a hand-written loop

@pytest.mark.parametrize("variant", ["pipes", "colon", "equals"])
def test_generic_step_kv(variant: str) -> None:
    p = params(f"loop_{variant}")
    recs = records(f"loop_{variant}.merged")
    assert [r.fmt for r in recs] == ["kv"] * p["steps"]
    assert [r.step for r in recs] == list(range(1, p["steps"] + 1))
    for r in recs:
        assert (nonfinite if r.step > p["nan_step"] else finite)(r.loss), r
        assert r.lr == pytest.approx(3e-4)
        if variant != "colon":
            assert (nonfinite if r.step > p["nan_step"] else finite)(r.grad_norm), r


# --------------------------------------------------------------------------------- llm.c and nanotron

def test_llmc_cuda_stdout() -> None:
    p = params("llmc")
    recs = records("llmc.stdout")
    assert all(r.fmt == "llmc" for r in recs)
    train = [r for r in recs if r.loss is not None]
    val = [r for r in recs if r.val_loss is not None]
    n = p["train_num_batches"]
    assert [r.step for r in train] == list(range(1, n + 1))  # printed as step + 1
    for r in train:
        broken = known(r.step) - 1 >= p["nan_step"]
        assert (nonfinite if broken else finite)(r.loss) and (nonfinite if broken else finite)(r.grad_norm)
        assert r.extra["total"] == n and finite(r.tokens_per_sec) and finite(r.lr)
        assert finite(r.extra["time_ms"]) and finite(r.extra["mfu"])
    val_steps = [s for s in range(n + 1) if s % p["val_loss_every"] == 0 or s == n]
    assert len(val) == len(val_steps) and all(r.step is None for r in val)
    for s, r in zip(val_steps, val):
        assert (nonfinite if s >= p["nan_step"] else finite)(r.val_loss)
    assert any("-nan" in s for s in segments(CORPUS / "llmc.stdout"))


def test_llmc_main_log() -> None:
    p = params("llmc")
    assert MetricParser().wants_all_lines("file:/log/main.log")  # its lines hold no keyword
    recs = records("llmc_main.log", source="file:/log/main.log")
    train = [r for r in recs if r.loss is not None]
    val = [r for r in recs if r.val_loss is not None]
    assert [r.step for r in train] == list(range(p["train_num_batches"]))  # 0-based here
    for r in train:
        assert (nonfinite if r.step >= p["nan_step"] else finite)(r.loss)
        assert (nonfinite if r.step >= p["nan_step"] else finite)(r.grad_norm)
    assert [r.step for r in val] == [s for s in range(p["train_num_batches"] + 1)
                                     if s % p["val_loss_every"] == 0 or s == p["train_num_batches"]]
    # "s:N eval:X" is HellaSwag accuracy, not a loss.
    evals = [(s, r) for s, r in parse_file("llmc_main.log", "file:/log/main.log") if " eval:" in s]
    assert evals and all(r is None for _, r in evals)


def test_llmc_cpu_reference() -> None:
    p = params("llmc")
    recs = records("llmc_cpu.stdout")
    train = [r for r in recs if r.loss is not None]
    assert [r.step for r in train] == list(range(p["c_steps"]))
    assert all(r.fmt == "llmc" and finite(r.loss) and r.extra["time_ms"] > 0 for r in train)
    assert len([r for r in recs if r.val_loss is not None]) == len(range(0, p["c_steps"], 10))


def test_llmc_every_historical_format() -> None:
    p = params("llmc")
    recs = records("llmc_formats.stdout")
    assert len(recs) == len(p["history_formats"]) * len(p["history_steps"])
    for i, r in enumerate(recs):
        assert r.fmt == "llmc"
        assert r.step == p["history_steps"][i % len(p["history_steps"])]
        assert (nonfinite if r.step >= p["history_nan_from"] else finite)(r.loss), (i, r)


def test_nanotron() -> None:
    p = params("nanotron")
    recs = records("nanotron.stdout")
    assert [r.fmt for r in recs] == ["nanotron"] * p["train_steps"]
    assert [r.step for r in recs] == list(range(1, p["train_steps"] + 1))
    for r in recs:
        assert (nonfinite if r.step >= p["nan_step"] else finite)(r.loss)
        if r.step == p["inf_step"]:
            assert r.grad_norm == math.inf  # human_format(inf) prints "infE"
        assert finite(r.tokens_per_sec) and finite(r.lr) and r.extra["total"] == p["train_steps"]
        assert r.extra["consumed_tokens"] > 1000  # "2.05K"


# ------------------------------------------------------------------------------------ the whole corpus

def test_every_corpus_file_is_covered() -> None:
    """Every captured file is exercised above, and every run in the manifest has its files."""
    covered = {"hf5_filter_on", "hf5_filter_off", "hf5_printer", "hf5_logprefix", "hf5_resume",
               "hf4_filter_on", "hf4_filter_off", "hf4_resume", "pl_train_loss", "pl_loss", "pl_rich",
               "loop_pipes", "loop_colon", "loop_equals", "llmc", "nanotron",
               "loop_logging", "loop_tqdm"}  # the last two: tests/watch/test_generic_corpus.py
    assert set(MANIFEST) == covered
    for run, entry in MANIFEST.items():
        if entry["kind"] in ("hf", "lightning", "loop", "job"):
            for stream in ("stdout", "stderr", "merged"):
                assert (CORPUS / f"{run}.{stream}").is_file(), (run, stream)
    data_files = {f.name for f in CORPUS.iterdir() if f.is_file()  # metricfiles/: test_tbevents.py's corpus
                  and f.name not in ("README.md", "capture.py", "manifest.json", ".gitattributes")}
    expected = {f"{run}.{s}" for run, e in MANIFEST.items() if e["kind"] in ("hf", "lightning", "loop", "job")
                for s in ("stdout", "stderr", "merged")}
    expected |= {"pl_train_loss.metrics.csv", "llmc.stdout", "llmc_main.log", "llmc_cpu.stdout",
                 "llmc_formats.stdout", "nanotron.stdout"}
    assert data_files == expected


def test_no_record_from_plain_output() -> None:
    """Warnings, the Trainer's own INFO lines, Lightning's banner: nothing parses as a metric."""
    for name in ("hf5_logprefix.stderr", "pl_train_loss.stderr", "hf4_filter_on.stdout"):
        for seg, rec in parse_file(name):
            if rec is None:
                continue
            assert rec.fmt in ("hf", "progress"), (name, seg)
            assert "{'" in seg or "%|" in seg
