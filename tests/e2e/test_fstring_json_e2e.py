"""Through the real daemon (issue 34, "no false assurance"): a job that prints its metrics as JSON
with an f-string, ``print(f'{{"step": {s}, "loss": {loss}}}')``, writes ``{"step": 20, "loss": nan}``
once its loss is NaN: no JSON. Such lines were dropped unsaid and the run ended exit 0 "finished ...
watched: stdout (json, 19 records)" over a NaN model. Now Python's spellings are values: rolled back
at step 20, from its output and from a ``metrics.jsonl`` it writes so. A JSON metric line that still
gives no record (``tensor(nan)`` printed into it) is said (``metric_lines_unread``) and the end says
how many were not read, never full assurance.
"""
from __future__ import annotations

import sys
from pathlib import Path

from tests.conftest import history

PY = sys.executable

# Attempt 0 writes its NaN from step 20 (as written, %s: the loss's spelling, an expression of s and
# loss), then waits to be stopped; the restart runs clean. The sink (%r): "print" (stdout) or "jsonl"
# (metrics.jsonl in its workdir).
JOB = """\
import os, sys, time
first = os.environ["TSUP_ATTEMPT"] == "0"
sink = %r
out = open("metrics.jsonl", "a") if sink == "jsonl" else sys.stdout
for s in range(1, 31):
    loss = float("nan") if first and s >= 20 else 2.5 - s / 100
    shown = %s
    out.write(f'{{"step": {s}, "loss": {shown}, "lr": {3e-4}}}\\n')
    out.flush()
    if first and s >= 20:
        time.sleep(0.2)
if first:
    time.sleep(60)
"""


def config(tmp: Path) -> Path:
    cfg = tmp / "t.toml"
    cfg.write_text(f'[job]\nworkdir = "{tmp}"\n\n[shutdown]\ngrace_s = 2\n')
    return cfg


def wrap(tmp: Path) -> list[str]:
    return ["wrap", "--state-dir", str(tmp / "sd"), "--backoff", "0", "--config", str(config(tmp)), "--"]


def test_an_f_string_json_nan_on_stdout_is_rolled_back(daemons, tmp_path: Path) -> None:
    job = tmp_path / "job.py"
    job.write_text(JOB % ("print", "loss"))
    d = daemons(wrap(tmp_path) + [PY, str(job)])
    assert d.wait(90) == 0, d.stderr()[-3000:]
    h = history(tmp_path / "sd")
    a = h["attempts"]
    assert [(x["cause"], x["action"]) for x in a] == [("nan", "rollback"), (None, None)], a
    assert (a[0]["detection"]["step"], a[0]["detection"]["onset_step"]) == (20, 20), a[0]["detection"]
    assert a[0]["detection"]["evidence"].startswith('{"step": 20, "loss": nan'), a[0]["detection"]
    assert "unread" not in h["reason"], h["reason"]


def test_an_f_string_json_nan_in_a_metrics_jsonl_is_rolled_back(daemons, tmp_path: Path) -> None:
    job = tmp_path / "job.py"
    job.write_text(JOB % ("jsonl", "loss"))
    d = daemons(wrap(tmp_path) + [PY, str(job)])
    assert d.wait(90) == 0, d.stderr()[-3000:]
    a = history(tmp_path / "sd")["attempts"]
    assert [(x["cause"], x["action"]) for x in a] == [("nan", "rollback"), (None, None)], a
    det = a[0]["detection"]
    assert det["step"] == 20 and det["source"] == f"file:{tmp_path / 'metrics.jsonl'}", det


def test_json_metric_lines_no_reader_reads_are_said_and_the_end_is_not_full_assurance(daemons, tmp_path: Path) -> None:
    # tensor(nan) in the line: not JSON even so. Said once (attempt 0), counted, and the end says it.
    job = tmp_path / "job.py"
    job.write_text(JOB.replace("if first:\n    time.sleep(60)\n", "") % ("print", 'f"tensor({loss})" if s >= 20 else loss'))
    d = daemons(wrap(tmp_path) + [PY, str(job)])
    assert d.wait(90) == 0, d.stderr()[-3000:]
    h = history(tmp_path / "sd")
    assert [(x["cause"], x["exit_code"]) for x in h["attempts"]] == [(None, 0)], h["attempts"]
    [said] = [e for e in h["events"] if e["event"] == "metric_lines_unread"]
    assert said["level"] == "warning" and said["data"]["source"] == "stdout", said
    assert said["data"]["sample"] == '{"step": 20, "loss": tensor(nan), "lr": 0.0003}', said
    assert "NOT judged" in said["message"] and "Watching goes on" in said["message"]
    assert "stdout (json, 19 records, 11 lines unread)" in h["reason"], h["reason"]
    assert "NOT fully watched: 11 lines of stdout" in h["reason"], h["reason"]
    assert "event=metric_lines_unread" in d.stderr()
