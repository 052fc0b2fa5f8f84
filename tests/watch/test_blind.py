"""Saying what it sees: the per-source book, the blind bound and its fix (an injected clock)."""
from __future__ import annotations

import re

from supervisor.core.observations import MetricRecord
from supervisor.watch.blind import BlindWatch, guess_regex, redact
from supervisor.watch.config import DetectorsConfig, ParsersConfig
from supervisor.watch.logwatch import LogWatcher
from supervisor.watch.parsers import MetricParser
from supervisor.watch.sources import SourceBook

# Prose around the numbers: no built-in format (the generic one included) claims it.
UNKNOWN = ">>> worker 0 finished iter {i} of 300 with train_loss {loss} and lr 0.05"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _watcher(clock: Clock, **kw: object) -> tuple[LogWatcher, list[MetricRecord]]:
    recs: list[MetricRecord] = []
    cfg = DetectorsConfig(**kw)  # type: ignore[arg-type]
    return LogWatcher(cfg, lambda d: None, recs.append, clock=clock), recs


def test_source_book_keeps_formats_records_last_step_and_age_per_source():
    clock = Clock()
    book = SourceBook(clock, max_sources=2)
    book.note("stdout", "kv", 10)
    clock.t += 5
    book.note("stdout", "hf", None)  # a stepless record keeps the last step
    book.note("file:/x/metrics.csv", "csv", 4)
    clock.t += 1
    snap = {s["source"]: s for s in book.snapshot()}
    assert snap["stdout"] == {"source": "stdout", "formats": ["kv", "hf"], "records": 2, "unread": 0,
                              "last_step": 10, "age_s": 1.0}
    assert snap["file:/x/metrics.csv"]["last_step"] == 4
    book.note("tb:/x/events", "tensorboard", 7)  # past the cap: the stalest source goes
    assert [s.source for s in book.states()][0] == "tb:/x/events" and len(book) == 2


def test_logwatcher_books_each_source_that_yielded_records():
    clock = Clock()
    lw, recs = _watcher(clock)
    lw.feed("stdout", ['{"step": 3, "loss": 2.5}', "hello"])
    lw.feed("stderr", [" 17%|█▋        | 5/30 [00:00<00:00, 49.08it/s]"])
    st = {s["source"]: s for s in lw.status()["metric_sources"]}
    assert st["stdout"]["formats"] == ["json"] and st["stdout"]["last_step"] == 3 and st["stdout"]["records"] == 1
    assert st["stderr"]["formats"] == ["progress"] and st["stderr"]["last_step"] == 5
    assert lw.status()["metrics_blind"] is None and lw.blind_notice(clock.t) is None


def test_unknown_format_is_blind_after_the_line_bound_once_per_run_with_a_working_fix() -> None:
    clock = Clock()
    lw, recs = _watcher(clock, blind_after_lines=50, blind_after_s=0)
    lw.reset(0, None)
    lw.feed("stdout", [UNKNOWN.format(i=i, loss=2.0) for i in range(49)] + ["", "  "])
    assert lw.blind_notice(clock.t) is None  # 49 non-empty lines: blank ones do not count
    lw.feed("stderr", ["HF_TOKEN=hf_abcdef123 loaded; Authorization: Bearer sk-xyz"])
    n = lw.blind_notice(clock.t)
    assert n is not None and n.event == "metrics_blind" and n.level == "warning"
    assert n.data["lines"] == 50 and "Formats tried: json, hf," in n.message and "kv, generic" in n.message
    assert 3 <= n.message.count("\n  | ") <= 5
    assert "hf_abcdef123" not in n.message and "sk-xyz" not in n.message
    assert "--metric-regex '" in n.message and "[detectors.parsers] regexes" in n.message
    assert "--watch-file" in n.message and "supervisor.client" in n.message
    # The guessed regex parses the job's own line: step and the NaN.
    rx = n.data["regex"]
    rec = MetricParser([rx], auto=False).parse(UNKNOWN.format(i=60, loss="nan"))
    assert rec is not None and rec.step == 60 and rec.loss != rec.loss
    assert ParsersConfig(regexes=(rx,))  # a valid [detectors.parsers] regex
    assert lw.status()["metrics_blind"]["fix"].startswith("wrap --metric-regex")  # type: ignore[index]
    assert lw.blind_notice(clock.t) is None  # said once
    # A restart loop: the next attempts are blind again, but the run was told already.
    for attempt in (1, 2):
        lw.reset(attempt, None)
        lw.feed("stdout", [UNKNOWN.format(i=i, loss=2.0) for i in range(60)])
        assert lw.blind_notice(clock.t) is None
    assert lw.status()["metrics_blind"] is not None
    # Steps appear: said once, and status clears.
    lw.feed("stdout", ["step 61 | loss 2.1 | lr 3e-4"])
    seen = lw.blind_notice(clock.t)
    assert seen is not None and seen.event == "metrics_seen" and seen.level == "info" and seen.data["step"] == 61
    assert lw.status()["metrics_blind"] is None and lw.blind_notice(clock.t) is None


def test_blind_by_seconds_of_run_time_whatever_it_printed_nothing_included():
    clock = Clock()
    lw, _ = _watcher(clock, blind_after_lines=0, blind_after_s=120)
    lw.reset(0, None)
    lw.feed("stdout", ["loading the model"])
    clock.t += 119
    assert lw.blind_notice(clock.t) is None
    clock.t += 1  # a banner, then silence: 120 s of run time without a step is blind
    n = lw.blind_notice(clock.t)
    assert n is not None and n.data["seconds"] == 120.0 and n.data["regex"] is None and n.data["lines"] == 1
    assert "a template" in n.message and "120.0 s of run time" in n.message  # no loss-like number in any line
    # A job that prints nothing at all is blind too, and told how to be read.
    silent, _ = _watcher(clock, blind_after_lines=200, blind_after_s=120)
    silent.reset(0, None)
    clock.t += 120
    n = silent.blind_notice(clock.t)
    assert n is not None and "the job printed nothing in 120.0 s" in n.message and n.data["lines"] == 0
    assert "Sample lines" not in n.message and "print a line per logged step" in n.message
    # No run time passes once the attempt ended (between attempts, after the last one).
    idle, _ = _watcher(clock, blind_after_lines=0, blind_after_s=120)
    idle.reset(0, None)
    idle.blind.ended()
    clock.t += 1000
    assert idle.blind_notice(clock.t) is None


def test_a_job_whose_steps_parse_is_never_blind_and_zero_disables():
    clock = Clock()
    lw, _ = _watcher(clock, blind_after_lines=5)
    lw.reset(0, None)
    lw.feed("stdout", ["step 1 | loss 2.0"] + ["noise"] * 100)
    assert lw.blind_notice(clock.t) is None
    off, _ = _watcher(clock, blind_after_lines=0, blind_after_s=0)
    off.feed("stdout", ["noise"] * 1000)
    clock.t += 1000
    off.feed("stdout", ["noise"])
    assert off.blind_notice(clock.t) is None


def test_guess_regex_covers_the_common_shapes():
    for line, step, loss in [
        ("epoch 0 | iter 60/300 | train_loss=nan | lr=0.05", 60, None),
        ("[12:00:01] it 7 lm loss: 7.3E+00 tokens 1234", 7, 7.3),
        ("Loss 2.31 at global_step=40", 40, 2.31),
        ("val: loss=1.5", None, 1.5),
    ]:
        rx = guess_regex(line)
        assert rx is not None, line
        re.compile(rx)
        rec = MetricParser([rx], auto=False).parse(line)
        assert rec is not None and rec.step == step
        assert (rec.loss != rec.loss) if loss is None else rec.loss == loss
    assert guess_regex("epoch 3 done in 12.5 s") is None
    # Only the loss word itself (or a known two-word name), never the prose before it.
    assert guess_regex(UNKNOWN.format(i=3, loss=2.0)) == r"iter\s+(?P<step>\d+).*?train_loss\s+(?P<loss>[-+.\w]+)"
    assert guess_regex("step=4, lm loss: 7.1") == r"step=(?P<step>\d+).*?lm\s+loss:\s*(?P<loss>[-+.\w]+)"


def test_redact_keeps_names_drops_values():
    assert redact("WANDB_API_KEY=abc123 step 3") == "WANDB_API_KEY=<redacted> step 3"
    assert "s3cr3t" not in redact("db password: s3cr3t, loss 2")
    assert redact("loss=2.0 step=3") == "loss=2.0 step=3"
    assert redact("step 3 tokens_per_sec=4500 num_tokens 1,234") == "step 3 tokens_per_sec=4500 num_tokens 1,234"
    assert redact("api_token: 'abc-def'") == "api_token: '<redacted>'"


def test_blind_watch_alone_counts_only_until_a_step():
    bw = BlindWatch(3, 0)
    bw.lines(["a 1"], 0.0)
    bw.stepped("stdout", "kv", 1)
    bw.lines(["b", "c", "d", "e"], 1.0)
    assert bw.check(2.0) is None and bw.status() is None


def test_the_fix_names_the_files_the_attempt_wrote_never_the_supervisors_own(tmp_path):
    import os

    from supervisor.watch.candidates import own_output, written_files

    (tmp_path / "logs").mkdir()
    (tmp_path / "old.log").write_text("x")
    os.utime(tmp_path / "old.log", (1000, 1000))  # before the attempt: not its output
    (tmp_path / "logs" / "train.log").write_text("iter 1 ...")
    (tmp_path / "model.bin").write_bytes(b"\0")  # a checkpoint: never where metrics are
    (tmp_path / "losses.dat").write_bytes(b"\0" * 8)  # a private format
    (tmp_path / "sd").mkdir()
    (tmp_path / "sd" / "job.log").write_text("excluded: the supervisor's own copy")
    os.link(tmp_path / "sd" / "job.log", tmp_path / "job-copy.log")  # the same file by another name
    console = tmp_path / "console.log"  # where the daemon's own stdout is redirected
    since = (tmp_path / "logs" / "train.log").stat().st_mtime - 1
    with open(console, "w") as out:
        own = own_output(tmp_path / "sd", fds=[out.fileno()])
    found = written_files([tmp_path], since, own, skip_dirs=[tmp_path / "sd"])
    assert sorted((w.name, w.kind) for w in found) == [("logs/train.log", "text"), ("losses.dat", "other")]
    bw = BlindWatch(2, 0)
    bw.find_written = lambda: written_files([tmp_path], since, own, skip_dirs=[tmp_path / "sd"])
    bw.lines(["a 1", "b 2"], 0.0)
    n = bw.check(0.0)
    assert n is not None and "the job writes logs/train.log" in n.message
    assert "wrap --watch-file logs/train.log" in n.message
    assert "losses.dat (a format no parser here reads)" in n.message
    assert "console.log" not in n.message and "job-copy.log" not in n.message and "job.log" not in n.message
    # A name that would forge a line of the console or the journal is said escaped; the walk is bounded.
    (tmp_path / "evil\n[12:00:00] == finished.log").write_text("x")
    (tmp_path / "fifo.log").unlink(missing_ok=True)
    os.mkfifo(tmp_path / "fifo.log")  # not a file: never opened, never named
    names = [w.name for w in written_files([tmp_path], since, own, skip_dirs=[tmp_path / "sd"])]
    assert "evil\\n[12:00:00] == finished.log" in names and not any("\n" in n for n in names)
    assert "fifo.log" not in names
    for i in range(700):
        (tmp_path / "logs" / f"r{i}.log").write_text("x")
    assert len(written_files([tmp_path], since, own)) <= 500


def test_a_sample_cut_inside_a_url_password_still_masks_it():
    # Samples are cut at 200 characters; a password the cut splits from its "@" is masked too.
    bw = BlindWatch(2, 0)
    bw.lines(["x" * 170 + " postgres://u:" + "S3CRET" * 20 + "@h/db 1", "loss 2"], 0.0)
    n = bw.check(1.0)
    assert n is not None and "S3CRET" not in n.message and "postgres://u:<redacted>…(+" in n.message
