"""The HTML + PNG report from a synthetic run with a NaN rollback, a hang restart and a crash."""

from __future__ import annotations

import base64
import math
import struct
import sys
from pathlib import Path

import pytest

from supervisor.report.data import ReportData, load_client_metrics, restart_markers
from supervisor.report.page import write_report

T0 = 1_700_000_000.0


def _iso(t: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(t, tz=timezone.utc).isoformat()


def synthetic() -> ReportData:
    metrics: list[tuple[float, int, float, int]] = []
    # attempt 0: steps 1..160, NaN at 160; attempt 1 resumes at 150 and hangs at 280;
    # attempt 2 resumes at 250 and finishes at 400
    for s in range(1, 160):
        metrics.append((T0 + s * 0.05, s, 3.0 * math.exp(-s / 200), 0))
    metrics.append((T0 + 160 * 0.05, 160, float("nan"), 0))
    for s in range(151, 281):
        metrics.append((T0 + 12 + (s - 150) * 0.05, s, 3.0 * math.exp(-s / 200), 1))
    for s in range(251, 401):
        metrics.append((T0 + 30 + (s - 250) * 0.05, s, 3.0 * math.exp(-s / 200), 2))
    ck = "/run/ckpt/step_{:06d}.pt"
    attempts = [
        {"attempt": 0, "argv": ["python", "train.py"], "started_at": _iso(T0), "ended_at": _iso(T0 + 8.2),
         "exit_code": None, "signal": "SIGTERM", "cause": "nan", "action": "rollback",
         "checkpoint": None, "remedies": [], "validation": None},
        {"attempt": 1, "started_at": _iso(T0 + 11), "ended_at": _iso(T0 + 26), "exit_code": None,
         "signal": "SIGKILL", "cause": "hang", "action": "restart", "checkpoint": ck.format(150),
         "remedies": [{"env": {"LR_SCALE": "0.5"}}],
         "validation": {"passed": True, "checks": {
             "initial_loss": {"passed": True, "value": 1.41, "expected": 1.42, "tolerance": 0.1},
             "throughput": {"passed": True, "value": 50000.0, "baseline": 52000.0}}}},
        {"attempt": 2, "started_at": _iso(T0 + 29), "ended_at": _iso(T0 + 38), "exit_code": 0,
         "signal": None, "cause": None, "action": None, "checkpoint": ck.format(250), "remedies": [],
         "validation": {"passed": False, "checks": [
             {"name": "grad_norm", "passed": False, "value": 9.5, "limit": 2.0}]}},
    ]
    checkpoints = [
        {"path": ck.format(s), "step": s, "exists": True, "complete": True, "sha256_ok": s != 300,
         "config_matches": True, "config_diff": {},
         "val_metric": {"name": "val_loss", "value": 1.5, "step": s},
         "load_test": {"passed": s != 300, "seconds": 0.4, "error": None if s != 300 else "truncated"},
         "ready": s != 300, "reasons": [] if s != 300 else ["sha256 mismatch"]}
        for s in (400, 300, 250, 150)
    ]
    events = [{"at": T0 + 8.0, "attempt": 0, "event": "detection", "cause": "nan",
               "summary": "loss is nan at step 160", "step": 160}]
    goodput = {"productive_s": 30.0, "lost_s": {"nan": 3.0, "hang": 4.5, "restart": 2.5}, "ratio": 0.75}
    return ReportData(run_id="demo-1", metrics=metrics, attempts=attempts, events=events,
                      checkpoints=checkpoints, goodput=goodput, summary={"final val_loss": 0.61})


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_markers_name_the_previous_cause_and_the_rollback_step() -> None:
    markers = restart_markers(synthetic())
    assert [(m.attempt, m.cause, m.action, m.resume_step, m.previous_last_step) for m in markers] == [
        (1, "nan", "rollback", 150, 160), (2, "hang", "restart", 250, 280)]
    assert [m.is_rollback for m in markers] == [True, False]  # the hang was restarted, not rolled back
    assert markers[0].label == "restart 1 after nan: rollback to step 150"


def test_report_renders_html_with_markers_and_a_valid_png(tmp_path: Path) -> None:
    html_path, png_path = write_report(synthetic(), tmp_path / "out")
    assert png_path is not None and png_path == tmp_path / "out" / "loss_curve.png"
    png = png_path.read_bytes()
    width, height = _png_size(png)
    assert width > 600 and height > 400
    page = html_path.read_text()
    assert page.startswith("<!DOCTYPE html>")
    # the PNG is embedded, byte for byte
    assert f"data:image/png;base64,{base64.b64encode(png).decode()}" in page
    # restart/rollback markers, causes, goodput, checkpoints, validation verdicts
    assert page.count("<td>rollback</td>") >= 2
    assert "<td>nan</td>" in page and "<td>hang</td>" in page
    assert "75.0%" in page and "<td>4.5</td>" in page
    assert "sha256 mismatch" in page and "val_loss = 1.5 @ 150" in page
    assert "initial_loss" in page and "grad_norm" in page
    assert '<span class="fail">fail</span>' in page and '<span class="pass">pass</span>' in page
    assert "loss is nan at step 160" in page
    assert "LR_SCALE" in page  # the remedy applied to attempt 1


def test_report_without_matplotlib_still_writes_the_page(tmp_path: Path, monkeypatch) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    html_path, png_path = write_report(synthetic(), tmp_path)
    assert png_path is None and not (tmp_path / "loss_curve.png").exists()
    page = html_path.read_text()
    assert "matplotlib is not installed" in page and "data:image/png" not in page
    assert "<td>rollback</td>" in page


def test_single_attempt_report_has_no_restarts(tmp_path: Path) -> None:
    data = ReportData(run_id="clean", metrics=[(T0 + s, s, 2.0 / s, 0) for s in range(1, 50)],
                      attempts=[{"attempt": 0, "started_at": _iso(T0), "ended_at": _iso(T0 + 50),
                                 "exit_code": 0, "cause": None, "action": None}])
    html_path, png_path = write_report(data, tmp_path)
    assert png_path is not None and _png_size(png_path.read_bytes())[0] > 0
    page = html_path.read_text()
    assert "No restarts" in page and "No goodput figures" in page


@pytest.mark.parametrize("bad", ["<script>alert(1)</script>"])
def test_report_escapes_text(tmp_path: Path, bad: str) -> None:
    data = ReportData(run_id=bad, events=[{"event": "x", "summary": bad}])
    html_path, _ = write_report(data, tmp_path)
    assert bad not in html_path.read_text()


def test_client_metric_files_feed_the_report(tmp_path: Path) -> None:
    f = tmp_path / "metrics-rank0.jsonl"
    f.write_text(
        '{"step":2,"loss":2.5,"rank":0,"attempt":0,"t":1700000000.2}\n'
        '{"step":1,"loss":3.0,"rank":0,"attempt":0,"t":1700000000.1}\n'
        '{"step":3,"loss":NaN,"rank":0,"attempt":0,"t":1700000000.3}\n'
        '{"step":3,"grad_norm":1.0,"rank":0,"attempt":1,"t":1700000001.0}\n'  # no loss: skipped
        '{"step":3,"loss":2.4,"rank":0,"attempt":1,"t":1700000001.1}\n'
        '{"step":4,"lo'  # torn last line of a killed job
    )
    pts = load_client_metrics([f, tmp_path / "missing.jsonl"])
    assert [(s, a) for _, s, _, a in pts] == [(1, 0), (2, 0), (3, 0), (3, 1)]
    assert math.isnan(pts[2][2])


def test_the_report_shows_the_checkpoint_interval_advice_and_what_the_current_interval_costs() -> None:
    import dataclasses

    from supervisor.core.interval import advise
    from supervisor.report.page import render_html

    advice = advise(save_cost_s=6.0, run_seconds=4 * 3600.0, failures=4, restart_s=40.0, current_s=1800.0)
    assert advice is not None and advice.goodput_now is not None
    page = render_html(dataclasses.replace(synthetic(), interval=advice.to_json()), None)
    section = page[page.index("<h3>Checkpoint interval</h3>"):page.index("<h2>Checkpoints</h2>")]
    assert "saving every 30 min costs" in section  # the status line, as `status` shows it
    assert f"<td>{round(advice.advised_s, 1):g}</td>" in section and "<td>1800</td>" in section
    assert f"<td>{1 - advice.goodput_now:.1%}</td>" in section  # the cost of the job's own interval
    assert f"<td>{advice.goodput_advised:.1%}</td>" in section
    assert "No advice" in render_html(synthetic(), None)  # none yet: the page says what it needs
