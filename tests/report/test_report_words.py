"""The report says things in words: its summary in words and units (never raw JSON or a Python
repr), its restart table's marker the supervisor's decision, its checkpoint table the load tests
that ran (the daemon's verdicts, read back from the state dir)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from supervisor.report.data import ReportData, restart_markers
from supervisor.report.page import write_report
from tests.report.test_report import synthetic


def _section(page: str, title: str) -> str:
    start = page.index(f"<h2>{title}</h2>")
    end = page.find("<h2>", start + 1)
    return page[start:end if end > 0 else None]


def _rows(section: str) -> list[list[str]]:
    return [re.findall(r"<td>(.*?)</td>", tr) for tr in re.findall(r"<tr>(.*?)</tr>", section)[1:]]


def test_the_marker_is_the_decision_and_every_restart_says_what_it_redid(tmp_path: Path) -> None:
    markers = restart_markers(synthetic())
    # attempt 1 followed a NaN (rolled back before it), attempt 2 a hang (restarted from the newest)
    assert [(m.is_rollback, m.steps_redone) for m in markers] == [(True, 10), (False, 30)]
    html_path, _ = write_report(synthetic(), tmp_path)
    rows = _rows(_section(html_path.read_text(), "Restarts and rollbacks"))
    assert [(r[0], r[1], r[2], r[3], r[6]) for r in rows] == [
        ("rollback", "1", "nan", "rollback", "10"), ("restart", "2", "hang", "restart", "30")]


def test_the_summary_is_in_words_and_units(tmp_path: Path) -> None:
    data = synthetic()
    data = ReportData(run_id=data.run_id, metrics=data.metrics, attempts=data.attempts, goodput=data.goodput,
                      summary={"wall time": "2 min 05 s", "lost time by cause": {"crash": 9.3, "nan": 4.12},
                               "quarantined": ["step_000200.pt", "step_000300.pt"], "validated": True,
                               "final loss": 1.234567})
    html_path, _ = write_report(data, tmp_path)
    summary = dict((r[0], r[1]) for r in _rows(_section(html_path.read_text(), "Summary")))
    text = " ".join(summary.values())
    assert not re.search(r"[{}\[\]']|True|False|&#x27;|&quot;", text), summary
    assert summary["goodput"] == "75.0%"
    assert summary["lost time by cause"] == "crash 9.3, nan 4.12"  # the caller's breakdown wins
    assert summary["quarantined"] == "step_000200.pt, step_000300.pt"
    assert summary["validated"] == "true" and summary["final loss"] == "1.235"
    plain = ReportData(run_id="r", attempts=data.attempts, goodput=data.goodput)
    html_path, _ = write_report(plain, tmp_path / "plain")
    summary = dict((r[0], r[1]) for r in _rows(_section(html_path.read_text(), "Summary")))
    # the run's own goodput figures, largest first, each with its unit
    assert summary["lost time by cause"] == "hang 4.5 s, nan 3.0 s, restart 2.5 s"


def test_the_checkpoint_table_shows_the_load_tests_the_daemon_ran(tmp_path: Path) -> None:
    """The daemon's service load-tests two checkpoints (one with a NaN weight); the report, which
    runs no load test, shows both verdicts and a third checkpoint's "not run"."""
    pytest.importorskip("torch")
    from supervisor.checkpoints.service import CheckpointService
    from supervisor.config.model import config_from_table
    from supervisor.job.launch import config_json
    from supervisor.ledger.store import Ledger
    from supervisor.report.collect import write_run_report
    from tests.helpers.ckpt_factory import old_mtime, torch_file

    ckpt, state = tmp_path / "ckpt", tmp_path / "state"
    ckpt.mkdir()
    state.mkdir()
    cfg = config_from_table({"job": {"command": [sys.executable, "train.py"], "workdir": str(tmp_path)},
                             "checkpoints": {"dir": str(ckpt), "check_finite": True}, "state": {"dir": str(state)}})
    for step, nan in ((100, False), (200, True)):
        old_mtime(torch_file(ckpt / f"step_{step:06d}.pt", step, nan=nan))
    led = Ledger(state)
    run_id, _ = led.open_run("words", config_json(cfg))
    led.close()
    # as the daemon's checkpoint store builds it (supervisor/daemon/checkpointstore.py)
    svc = CheckpointService(cfg.checkpoints, ckpt, state, cfg.job.python, list(cfg.job.command), cfg.workdir())
    try:
        ran = {r.path.name: r.load_test for r in svc.quicklist()}
    finally:
        svc.close()
    assert ran["step_000100.pt"] is not None and ran["step_000100.pt"].passed
    assert ran["step_000200.pt"] is not None and not ran["step_000200.pt"].passed
    old_mtime(torch_file(ckpt / "step_000300.pt", 300))  # saved after the last load test

    html_path, _ = write_run_report(state, tmp_path / "report", run_id)
    rows = {Path(r[0]).name: r for r in _rows(_section(html_path.read_text(), "Checkpoints"))}
    assert rows["step_000100.pt"][7].startswith('<span class="pass">pass</span> ('), rows["step_000100.pt"]
    assert rows["step_000200.pt"][7].startswith('<span class="fail">fail</span>'), rows["step_000200.pt"]
    assert rows["step_000200.pt"][2] == '<span class="fail">fail</span>' and "load test failed" in rows["step_000200.pt"][8]
    assert rows["step_000300.pt"][7] == "not run"
