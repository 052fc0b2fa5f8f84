"""The run report: one self-contained HTML page, the PNG of the loss curve (:mod:`.plot`) beside it.

``write_report(ReportData(...), out_dir)`` writes ``report.html`` (the PNG embedded as base64) and
``loss_curve.png`` beside it. The page shows the loss over steps and over wall time with a marker at
every restart (labelled with the cause that ended the attempt before it) and every rollback (the
step the run went back to, the rolled-back span shaded), the attempt timeline with causes and
actions, goodput, the checkpoint quicklist and the post-reboot validation verdicts.

matplotlib is an optional extra (``transformer-supervisor[report]``) and is imported only when a
report is drawn; without it the page is still written, without the image, and says why. The
daemon may import this module: it never imports torch.
"""

from __future__ import annotations

import base64
import html
import io
import math
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import structlog

from .data import MetricPoint, ReportData, epoch_seconds, metric_points, restart_markers
from .plot import render_loss_png
from ..humanize import duration, durations_by, value as spell
from ..ownpaths import open_in, own_dir_fd

log = structlog.get_logger("supervisor.report.page")

HTML_NAME = "report.html"
PNG_NAME = "loss_curve.png"



_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:1200px}
h1{font-size:1.5em} h2{font-size:1.15em;margin-top:1.8em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f4f4f4} .pass{color:#176e2c;font-weight:600} .fail{color:#b00020;font-weight:600}
.note{background:#fff6d6;padding:.5em 1em;border-left:4px solid #e0b000}
.timeline{display:flex;height:26px;margin:.5em 0;border:1px solid #ccc}
.timeline div{overflow:hidden;white-space:nowrap;font-size:.75em;padding:4px;color:#fff}
code{font-size:.9em} img{max-width:100%}
"""


def _e(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return html.escape(f"{value:.4g}")
    return html.escape(spell(dict(value) if isinstance(value, Mapping) else value))  # as every output spells it


def _verdict(value: Any) -> str:
    if value is True or str(value).lower() in ("pass", "passed", "ok", "true"):
        return '<span class="pass">pass</span>'
    if value is False or str(value).lower() in ("fail", "failed", "false"):
        return '<span class="fail">fail</span>'
    return _e(value)


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _duration(a: Mapping[str, Any]) -> str:
    start, end = epoch_seconds(a.get("started_at")), epoch_seconds(a.get("ended_at"))
    return f"{end - start:.1f} s" if start is not None and end is not None else ""


def _summary_section(data: ReportData, points: list[MetricPoint]) -> str:
    facts: dict[str, Any] = {"run id": data.run_id, "attempts": len(data.attempts)}
    finite = [p for p in points if math.isfinite(p.loss)]
    if finite:
        last = max(finite, key=lambda p: (p.step, p.wall_time))
        facts["last step"] = last.step
        facts["last loss"] = last.loss
    if data.goodput and data.goodput.get("ratio") is not None:
        facts["goodput"] = f"{float(data.goodput['ratio']):.1%}"
        lost, by_cause = data.goodput.get("lost_s"), data.goodput.get("lost_by_cause")
        if isinstance(lost, (int, float)):
            facts["lost time"] = duration(lost)
        by_cause = by_cause if isinstance(by_cause, Mapping) else lost  # lost_s by cause: ReportData's shape
        if isinstance(by_cause, Mapping) and by_cause:
            facts["lost time by cause"] = durations_by(dict(by_cause))
    causes = [str(a.get("cause")) for a in data.attempts if a.get("cause")]
    if causes:
        facts["failures"] = ", ".join(causes)
    facts.update(data.summary)
    return _table(["", ""], ([html.escape(str(k)), html.escape(_words(v))] for k, v in facts.items()))


def _words(value: Any) -> str:
    """A summary fact as people read it, never raw JSON: a breakdown as ``crash 9.3, nan 4.1``, a
    list as its items, a number to 4 significant digits, anything else spelled as everywhere."""
    if isinstance(value, Mapping):
        return ", ".join(f"{k} {_words(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(_words(v) for v in value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return spell(value)


def _why(a: Mapping[str, Any]) -> str:
    """How the attempt ended, for people; with torchrun's root cause (failing rank, exception,
    last frame) when the job left one."""
    rc = a.get("root_cause")
    if isinstance(rc, Mapping) and rc.get("line"):
        return html.escape(str(a.get("summary") or "")) + f'<br><b>root cause</b>: {html.escape(str(rc["line"]))}'
    return html.escape(str(a.get("summary") or ""))


def _timeline_bar(data: ReportData) -> str:
    spans = []
    for a in sorted(data.attempts, key=lambda a: int(a.get("attempt", 0))):
        start, end = epoch_seconds(a.get("started_at")), epoch_seconds(a.get("ended_at"))
        if start is not None and end is not None and end > start:
            spans.append((a, start, end))
    if not spans:
        return ""
    t0, t1 = spans[0][1], max(e for _, _, e in spans)
    total = max(t1 - t0, 1e-9)
    parts, cursor = [], t0
    for a, start, end in spans:
        if start > cursor:
            parts.append(f'<div style="flex:{start - cursor:.3f};background:#bbb" '
                         f'title="downtime">&nbsp;</div>')
        ok = not a.get("cause")
        color = "#2e7d32" if ok else "#c62828"
        label = f"#{a.get('attempt')} {a.get('cause') or 'ok'}"
        parts.append(f'<div style="flex:{end - start:.3f};background:{color}" '
                     f'title="{_e(label)} ({end - start:.1f} s)">{_e(label)}</div>')
        cursor = max(cursor, end)
    return f'<div class="timeline" title="{total:.0f} s">{"".join(parts)}</div>'


def _validation_rows(data: ReportData) -> list[list[str]]:
    rows: list[list[str]] = []
    for a in data.attempts:
        v = a.get("validation")
        if not v:
            continue
        if not isinstance(v, Mapping):
            rows.append([_e(a.get("attempt")), _verdict(v), "", "", ""])
            continue
        overall = v.get("verdict", v.get("passed", v.get("ok")))
        checks = v.get("checks", v.get("metrics"))
        items: list[tuple[str, Any]] = []
        if isinstance(checks, Mapping):
            items = list(checks.items())
        elif isinstance(checks, (list, tuple)):
            items = [(str(c.get("name", i)) if isinstance(c, Mapping) else str(i), c)
                     for i, c in enumerate(checks)]
        if not items:
            rest = {k: val for k, val in v.items() if k not in ("verdict", "passed", "ok")}
            rows.append([_e(a.get("attempt")), _verdict(overall), "", "", _e(rest)])
        for name, check in items:
            if isinstance(check, Mapping):
                passed = check.get("passed", check.get("ok", check.get("verdict")))
                detail = {k: val for k, val in check.items()
                          if k not in ("name", "passed", "ok", "verdict")}
            else:
                passed, detail = check, {}
            rows.append([_e(a.get("attempt")), _verdict(overall), html.escape(name),
                         _verdict(passed), _e(detail)])
    return rows


def _event_row(ev: Mapping[str, Any]) -> list[str]:
    when = ev.get("at", ev.get("time", ev.get("timestamp", ev.get("ts"))))
    if isinstance(when, (int, float)):
        when = datetime.fromtimestamp(when, tz=timezone.utc).isoformat(timespec="seconds")
    kind = ev.get("event", ev.get("kind", ev.get("type", "")))
    text = ev.get("summary", ev.get("message", ev.get("msg", "")))
    known = {"at", "time", "timestamp", "ts", "event", "kind", "type", "summary", "message", "msg",
             "attempt", "cause"}
    rest = {k: v for k, v in ev.items() if k not in known}
    return [_e(when), _e(ev.get("attempt")), _e(kind), _e(ev.get("cause")), _e(text),
            _e(rest) if rest else ""]


def _interval_section(advice: Mapping[str, Any] | None) -> str:
    """The checkpoint interval that maximises goodput (core/interval.py) beside the job's own, and
    the goodput each gives; or why there is no advice yet."""
    if not advice:
        return ("<h3>Checkpoint interval</h3><p>No advice: it needs a counted failure in this state dir, "
                "and saves seen between the job's steps (the save cost comes from its step rhythm).</p>")

    def pct(v: Any) -> str:
        return f"{float(v):.1%}" if isinstance(v, (int, float)) else "n/a"

    def secs(v: Any) -> str:
        return f"{float(v):g}" if isinstance(v, (int, float)) else "n/a"

    rows = [["the job's now", secs(advice.get("current_s")), pct(advice.get("goodput_now")),
             pct(1 - advice["goodput_now"]) if isinstance(advice.get("goodput_now"), (int, float)) else "n/a"],
            ["advised (Young/Daly)", secs(advice.get("advised_s")), pct(advice.get("goodput_advised")),
             pct(1 - advice["goodput_advised"]) if isinstance(advice.get("goodput_advised"), (int, float)) else "n/a"]]
    return ("<h3>Checkpoint interval</h3>"
            f"<p>{_e(advice.get('summary') or '')}</p>"
            + _table(["interval", "seconds of training between saves", "expected goodput", "cost"], rows)
            + f"<p>from: a save costs {_e(secs(advice.get('save_cost_s')))} s, {_e(advice.get('failures'))} "
              f"counted failure(s), one per {_e(secs(advice.get('mtbf_s')))} s, a relaunch "
              f"{_e(secs(advice.get('restart_s')))} s</p>")


def render_html(data: ReportData, png_bytes: bytes | None, png_note: str | None = None) -> str:
    points = metric_points(data)
    markers = restart_markers(data)
    out: list[str] = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>{_e(data.title)}: {_e(data.run_id)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_e(data.title)}</h1>",
        f"<p>run <code>{_e(data.run_id)}</code>, report written "
        f"{datetime.now(tz=timezone.utc).isoformat(timespec='seconds')}</p>",
        "<h2>Summary</h2>", _summary_section(data, points),
        "<h2>Loss curve</h2>",
    ]
    if png_bytes is not None:
        b64 = base64.b64encode(png_bytes).decode("ascii")
        out.append(f'<img alt="loss over steps and wall time, with restart and rollback markers" '
                   f'src="data:image/png;base64,{b64}">')
    else:
        out.append(f'<p class="note">No loss plot: {_e(png_note or "not drawn")}. '
                   "Install the report extra (<code>pip install 'transformer-supervisor[report]'</code>)"
                   " to get it.</p>")

    out.append("<h2>Restarts and rollbacks</h2>")
    if markers:
        out.append(_table(
            ["marker", "attempt", "after cause", "action", "resumed at step", "previous last step",
             "steps redone"],
            ([("rollback" if m.is_rollback else "restart"), _e(m.attempt), _e(m.cause), _e(m.action),
              _e(m.resume_step if m.resume_step is not None else "scratch"), _e(m.previous_last_step),
              _e(m.steps_redone)]
             for m in markers),
        ))
    else:
        out.append("<p>No restarts: the run went through in one attempt.</p>")

    out.append("<h2>Attempt timeline</h2>")
    out.append(_timeline_bar(data))
    out.append(_table(
        ["attempt", "started", "ended", "duration", "exit code", "signal", "cause", "action",
         "checkpoint", "remedies", "why"],
        ([_e(a.get("attempt")), _e(a.get("started_at")), _e(a.get("ended_at")), _duration(a),
          _e(a.get("exit_code")), _e(a.get("signal")), _e(a.get("cause")), _e(a.get("action")),
          _e(a.get("checkpoint")), _e(a.get("remedies") or ""), _why(a)]
         for a in sorted(data.attempts, key=lambda a: int(a.get("attempt", 0)))),
    ))

    out.append("<h2>Goodput</h2>")
    if data.goodput:
        g = data.goodput
        rows = [["productive", _e(g.get("productive_s")), ""]]
        lost = g.get("lost_by_cause") if isinstance(g.get("lost_by_cause"), Mapping) else g.get("lost_s")
        if isinstance(lost, Mapping):
            rows += [["lost", _e(v), html.escape(str(k))] for k, v in sorted(lost.items())]
        elif lost is not None:
            rows.append(["lost", _e(lost), ""])
        ratio = g.get("ratio")
        out.append(f"<p>goodput ratio: <b>{_e(f'{float(ratio):.1%}' if ratio is not None else 'n/a')}"
                   "</b> (productive time / wall time: steps that were kept, not rolled back)</p>")
        out.append(_table(["time", "seconds", "cause"], rows))
    else:
        out.append("<p>No goodput figures recorded.</p>")
    out.append(_interval_section(data.interval))

    out.append("<h2>Checkpoints</h2>")
    if data.checkpoints:
        def _vm(row: Mapping[str, Any]) -> str:
            vm = row.get("val_metric")
            if isinstance(vm, Mapping):
                return _e(f"{vm.get('name')} = {vm.get('value'):.4g} @ {vm.get('step')}"
                          if isinstance(vm.get("value"), (int, float)) else vm)
            return _e(vm)

        def _lt(row: Mapping[str, Any]) -> str:
            lt = row.get("load_test")
            if isinstance(lt, Mapping):
                secs = lt.get("seconds")
                txt = _verdict(lt.get("passed"))
                if isinstance(secs, (int, float)):
                    txt += f" ({secs:.2f} s)"
                if lt.get("error"):
                    txt += f" {_e(lt.get('error'))}"
                return txt
            return "not run"

        out.append(_table(
            ["path", "step", "ready", "complete", "sha256", "config", "val metric", "load test",
             "reasons"],
            ([_e(r.get("path")), _e(r.get("step")), _verdict(r.get("ready")),
              _verdict(r.get("complete")), _verdict(r.get("sha256_ok")),
              _verdict(r.get("config_matches")), _vm(r), _lt(r), _e("; ".join(r.get("reasons") or []))]
             for r in data.checkpoints),
        ))
    else:
        out.append("<p>No checkpoints found.</p>")

    out.append("<h2>Validation after reboots</h2>")
    vrows = _validation_rows(data)
    if vrows:
        out.append(_table(["attempt", "verdict", "check", "result", "values"], vrows))
    else:
        out.append("<p>No post-reboot validation recorded.</p>")

    if data.events:
        out.append("<h2>Events</h2>")
        out.append(_table(["at", "attempt", "event", "cause", "summary", "details"],
                          (_event_row(ev) for ev in data.events)))
    out.append("</body></html>")
    return "\n".join(out)


def write_report(data: ReportData, out_dir: str | Path) -> tuple[Path, Path | None]:
    """Write ``report.html`` and ``loss_curve.png`` into ``out_dir``; return both paths.

    The PNG path is None when the plot could not be drawn (matplotlib missing or failing); the
    page then says so instead of showing the image.
    """
    out = Path(out_dir)
    # The default out dir is in the state dir, which the job's user may write, and `report` is
    # often run as root: the folder is entered without following a link (NotOurFolder, an OSError)
    # and each file written as a new temporary one beside it (O_EXCL, O_NOFOLLOW) then renamed over
    # its name, so a planted link (report.html -> /etc/passwd) is replaced, never written through.
    dfd = own_dir_fd(out, parents=True)
    try:
        return _write_report(data, out, dfd)
    finally:
        os.close(dfd)


def _replace_in(dfd: int, name: str, content: bytes) -> None:
    tmp = f".{name}.tmp"
    try:
        os.unlink(tmp, dir_fd=dfd)  # one left by a killed run (or a link planted there): removed, not followed
    except FileNotFoundError:
        pass
    fd = open_in(dfd, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(content)
    os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)


def _write_report(data: ReportData, out: Path, dfd: int) -> tuple[Path, Path | None]:
    png_path: Path | None = out / PNG_NAME
    png_bytes: bytes | None = None
    note: str | None = None
    try:
        buf = io.BytesIO()
        render_loss_png(data, buf)
        png_bytes = buf.getvalue()
        _replace_in(dfd, PNG_NAME, png_bytes)
    except ImportError as exc:
        note = f"matplotlib is not installed ({exc})"
        png_path = None
        log.warning("report_plot_skipped", reason=note, next="writing the HTML report without the plot")
    except Exception as exc:  # a plot failure must not lose the report
        note = f"the plot failed: {type(exc).__name__}: {exc}"
        png_path = None
        log.warning("report_plot_failed", reason=note, next="writing the HTML report without the plot")
    html_path = out / HTML_NAME
    _replace_in(dfd, HTML_NAME, render_html(data, png_bytes, note).encode("utf-8"))
    log.info("report_written", html=str(html_path), png=str(png_path) if png_path else None)
    return html_path, png_path
