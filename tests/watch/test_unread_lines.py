"""No silent drop (issue 34): a JSON metric line no reader reads is counted per source and said
(``metric_lines_unread``, once per source and attempt, rate-limited, its sample redacted), and the
run's end says the count; an f-string's ``{"loss": nan}`` is a NaN, from the job's output and from
a JSONL file it writes (watch/unparsed.py, watch/pyjson.py, core/runend.py)."""
from __future__ import annotations

import math
from pathlib import Path

from supervisor.core.observations import Detection, MetricRecord
from supervisor.core.runend import EndFacts, SourceSeen, Verdict, WeightsCheck, end_verdict
from supervisor.events import Cause
from supervisor.watch.config import DetectorsConfig
from supervisor.watch.logwatch import LogWatcher
from supervisor.watch.metricfiles import MetricFiles
from supervisor.watch.unparsed import MAX_SAID_PER_MIN


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def watcher(clock: Clock | None = None) -> tuple[LogWatcher, list[Detection], list[MetricRecord]]:
    dets: list[Detection] = []
    recs: list[MetricRecord] = []
    return LogWatcher(DetectorsConfig(), dets.append, recs.append, clock=clock or Clock()), dets, recs


def fstring_lines(nan_from: int, last: int, loss: str = "{loss}") -> list[str]:
    out = []
    for s in range(1, last + 1):
        value = float("nan") if s >= nan_from else 2.5 - s / 100
        out.append(("{{\"step\": {s}, \"loss\": " + loss + "}}").format(s=s, loss=value))
    return out


def unread_of(lw: LogWatcher, source: str) -> int:
    return {s["source"]: s for s in lw.sources.snapshot()}[source]["unread"]


def test_an_f_string_json_nan_is_detected_at_its_step() -> None:
    lw, dets, recs = watcher()
    lw.feed("stdout", fstring_lines(20, 25))
    assert dets and dets[0].cause is Cause.NAN and dets[0].step == 20 and dets[0].onset_step == 20
    assert unread_of(lw, "stdout") == 0 and not lw.take_notices()


def test_an_unreadable_json_metric_line_is_counted_and_said_once_per_source_and_attempt() -> None:
    lw, dets, recs = watcher()
    lines = [ln.replace('"loss": nan', '"loss": tensor(nan)') for ln in fstring_lines(20, 25)]
    lines[21] = lines[21][:-1] + ', "password": "hunter2-secret"}'
    lw.feed("stdout", lines)
    assert not dets and len(recs) == 19 and unread_of(lw, "stdout") == 6
    [said] = lw.take_notices()
    assert said.event == "metric_lines_unread" and said.level == "warning"
    assert said.data["source"] == "stdout" and said.data["count"] == 1 and "not JSON" in said.data["reason"]
    assert said.data["sample"] == '{"step": 20, "loss": tensor(nan)}'
    assert "NOT judged" in said.message and "Watching goes on" in said.message and "json.dumps" in said.message
    lw.feed("stdout", [lines[21]])  # the same source, the same attempt: counted, not said again
    assert unread_of(lw, "stdout") == 7 and not lw.take_notices()
    lw.reset(1, None)
    lw.feed("stdout", [lines[21]])
    [again] = lw.take_notices()
    assert again.data["count"] == 8 and lw.unread.attempt == 1
    assert "hunter2-secret" not in again.message + again.data["sample"]  # through the redactor


def test_notices_are_rate_limited_over_sources_and_a_source_not_said_is_said_later() -> None:
    clock = Clock()
    lw, _, _ = watcher(clock)
    line = '{"step": 1, "loss": tensor(nan)}'
    for i in range(MAX_SAID_PER_MIN + 2):
        lw.feed(f"log:/x/{i}.log", [line])
    assert len(lw.take_notices()) == MAX_SAID_PER_MIN
    assert all(unread_of(lw, f"log:/x/{i}.log") == 1 for i in range(MAX_SAID_PER_MIN + 2))
    clock.t += 61
    lw.feed(f"log:/x/{MAX_SAID_PER_MIN}.log", [line])
    [late] = lw.take_notices()
    assert late.data["source"] == f"log:/x/{MAX_SAID_PER_MIN}.log" and late.data["count"] == 2


def test_a_line_the_parser_reads_or_no_json_metric_line_is_never_counted() -> None:
    lw, _, recs = watcher()
    lw.feed("stdout", ['{"step": 1, "loss": 2.5}', '{"text": "loss went up"}', "step 2 loss 2.4",
                       '{"step": 3, "loss": null}', "{'loss': 2.3, 'epoch': 1.0}", '{"a": tensor(1)}'])
    assert len(recs) == 3 and all(s["unread"] == 0 for s in lw.sources.snapshot()) and not lw.take_notices()


def test_a_jsonl_file_written_with_an_f_string_gives_its_nan_and_its_unreadable_lines_are_said(tmp_path: Path) -> None:
    lw, dets, recs = watcher()
    mf = MetricFiles([tmp_path], lw, use_inotify=False)
    mf.baseline()
    m = tmp_path / "metrics.jsonl"
    m.write_text("\n".join(fstring_lines(20, 22)) + "\n")
    mf.scan_now()
    assert dets and dets[0].cause is Cause.NAN and dets[0].step == 20 and dets[0].source == f"file:{m}"
    t = tmp_path / "torch.jsonl"
    t.write_text("\n".join(fstring_lines(50, 3, loss="tensor({loss})")) + "\n")
    mf.scan_now()
    assert unread_of(lw, f"file:{t}") == 3
    [said] = lw.take_notices()
    assert said.data["source"] == f"file:{t}" and said.data["sample"] == '{"step": 1, "loss": tensor(2.49)}'


def facts(*sources: SourceSeen) -> EndFacts:
    return EndFacts(sources=sources, weights=WeightsCheck(None, None, note="no checkpoint"))


def test_the_end_says_the_unread_count_and_never_reads_as_full_assurance() -> None:
    v = end_verdict(facts(SourceSeen("stdout", ("json",), 19, 19, 100.0, 6)), attempt=0, ran_s=5.0, wall=101.0)
    assert v.verdict is Verdict.WATCHED
    assert "stdout (json, 19 records, 6 lines unread)" in v.reason
    assert "NOT fully watched: 6 lines of stdout started like metric records but gave none" in v.reason
    clean = end_verdict(facts(SourceSeen("stdout", ("json",), 19, 19, 100.0)), attempt=0, ran_s=5.0, wall=101.0)
    assert "unread" not in clean.reason and "NOT" not in clean.reason


def test_a_run_whose_only_metric_lines_were_unread_is_unwatched() -> None:
    v = end_verdict(facts(SourceSeen("stdout", (), 0, None, 100.0, 25)), attempt=0, ran_s=5.0, wall=101.0)
    assert v.verdict is Verdict.UNWATCHED and v.unwatched is not None
    assert "NOT fully watched: 25 lines of stdout" in v.reason and "NOT watched" in v.reason


def test_fstring_helper_matches_the_report() -> None:
    loss = float("nan")
    assert fstring_lines(1, 1)[0] == f'{{"step": {1}, "loss": {loss}}}' and math.isnan(loss)


def test_the_end_says_the_non_finite_values_it_set_aside_in_files_the_job_did_not_write() -> None:
    """A clean end over a NaN seen in a file the job was not shown to write (metric_file_untrusted)
    says so beside what it watched, and status's end carries the files."""
    from supervisor.core.runend import EndFacts, SourceSeen, watched_text

    seen = (SourceSeen("stdout", ("kv",), 40, 40, 100.0),)
    assert "NOT acted on" not in watched_text(EndFacts(sources=seen), 101.0)
    facts = EndFacts(sources=seen, withheld=(("/w/notes.txt", 4), ("/w/old.jsonl", None)))
    said = watched_text(facts, 101.0)
    assert "NOT acted on: a non-finite value in /w/notes.txt (step 4), /w/old.jsonl" in said, said
    assert "[job] watch_files" in said
    assert "NOT acted on" in watched_text(EndFacts(withheld=facts.withheld), 101.0)  # nothing watched too
