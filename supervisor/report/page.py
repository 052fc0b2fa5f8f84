"""The run report: one self-contained HTML page and a PNG of the loss curve.

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
import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

import structlog

log = structlog.get_logger("supervisor.report.page")

HTML_NAME = "report.html"
PNG_NAME = "loss_curve.png"
_STEP_IN_NAME = re.compile(r"(\d+)(?!.*\d)")


class MetricPoint(NamedTuple):
    """One loss observation: wall-clock time (epoch seconds), step, loss, attempt number."""

    wall_time: float
    step: int
    loss: float
    attempt: int


@dataclass(frozen=True)
class ReportData:
    """Everything the report shows; built by the runner / ``report`` command from the ledger.

    ``attempts`` follow the SPEC's ``history --json`` shape (``attempt``, ``started_at``,
    ``ended_at``, ``exit_code``, ``signal``, ``cause``, ``action``, ``checkpoint``, ``remedies``,
    ``validation``; an optional ``resume_step`` wins over the step read from the checkpoint).
    ``checkpoints`` are ``checkpoints --json`` rows. ``goodput``: ``productive_s``, ``lost_s``
    (a number, or a mapping cause -> seconds), ``ratio``. ``summary``: free key/value facts shown at
    the top (e.g. final loss, fault-free reference loss).
    """

    run_id: str
    metrics: Sequence[tuple[float, int, float, int]] = ()
    attempts: Sequence[Mapping[str, Any]] = ()
    events: Sequence[Mapping[str, Any]] = ()
    checkpoints: Sequence[Mapping[str, Any]] = ()
    goodput: Mapping[str, Any] | None = None
    summary: Mapping[str, Any] = field(default_factory=dict)
    title: str = "transformer-supervisor run report"

    @classmethod
    def from_history(
        cls,
        history: Mapping[str, Any],
        metrics: Iterable[tuple[float, int, float, int]],
        checkpoints: Sequence[Mapping[str, Any]] = (),
        goodput: Mapping[str, Any] | None = None,
        summary: Mapping[str, Any] | None = None,
    ) -> ReportData:
        """From a ``history --json`` document plus the metric series."""
        return cls(
            run_id=str(history.get("run_id", "")),
            metrics=tuple(metrics),
            attempts=tuple(history.get("attempts", ())),
            events=tuple(history.get("events", ())),
            checkpoints=tuple(checkpoints),
            goodput=goodput,
            summary=dict(summary or {}),
        )


@dataclass(frozen=True)
class Marker:
    """A restart of attempt ``attempt``: when, why the attempt before it ended, where it resumed."""

    attempt: int
    wall_time: float | None  # epoch seconds of the attempt's start
    cause: str  # cause of the previous attempt
    action: str  # what the supervisor did about it
    resume_step: int | None  # the step the run went back to (None: from scratch)
    previous_last_step: int | None  # the last step the previous attempt reached

    @property
    def is_rollback(self) -> bool:
        return (
            self.resume_step is not None
            and self.previous_last_step is not None
            and self.resume_step < self.previous_last_step
        )

    @property
    def label(self) -> str:
        where = f"step {self.resume_step}" if self.resume_step is not None else "scratch"
        return f"restart {self.attempt} after {self.cause}: {self.action} to {where}"


# --------------------------------------------------------------------------------------------
# Reading the inputs
# --------------------------------------------------------------------------------------------


def _epoch(value: Any) -> float | None:
    """ISO-8601 text (naive = UTC) or epoch seconds -> epoch seconds."""
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        dt = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def _points(data: ReportData) -> list[MetricPoint]:
    pts = [MetricPoint(float(t), int(s), float(l), int(a)) for t, s, l, a in data.metrics]
    return sorted(pts, key=lambda p: (p.wall_time, p.attempt, p.step))


def _checkpoint_step(path: str | None, checkpoints: Sequence[Mapping[str, Any]]) -> int | None:
    if not path:
        return None
    for row in checkpoints:
        if row.get("path") == path and row.get("step") is not None:
            return int(row["step"])
    match = _STEP_IN_NAME.search(Path(path).name)
    return int(match.group(1)) if match else None


def restart_markers(data: ReportData) -> list[Marker]:
    """One marker per attempt after the first, oldest first."""
    attempts = sorted(data.attempts, key=lambda a: int(a.get("attempt", 0)))
    points = _points(data)
    last_step: dict[int, int] = {}
    for p in points:
        last_step[p.attempt] = max(last_step.get(p.attempt, p.step), p.step)
    markers: list[Marker] = []
    for prev, cur in zip(attempts, attempts[1:]):
        n = int(cur.get("attempt", 0))
        resume = cur.get("resume_step")
        if resume is None:
            resume = _checkpoint_step(cur.get("checkpoint"), data.checkpoints)
        if resume is None and not cur.get("checkpoint"):
            resume = 0  # relaunched without a checkpoint: back to the start
        markers.append(
            Marker(
                attempt=n,
                wall_time=_epoch(cur.get("started_at")),
                cause=str(prev.get("cause") or "unknown"),
                action=str(prev.get("action") or "restart"),
                resume_step=int(resume) if resume is not None else None,
                previous_last_step=last_step.get(int(prev.get("attempt", 0))),
            )
        )
    return markers


def load_client_metrics(paths: Iterable[str | Path]) -> list[tuple[float, int, float, int]]:
    """``(wall_time, step, loss, attempt)`` from the client's ``metrics-rank*.jsonl`` files.

    The client appends one JSON object per ``report()`` with ``t``, ``step``, ``loss`` and
    ``attempt``; records without a step or a loss, and unreadable lines (a torn last line of a
    killed job), are skipped. NaN/Infinity losses are kept: the plot marks them.
    """
    out: list[tuple[float, int, float, int]] = []
    for path in paths:
        try:
            lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                rec = json.loads(line)
                out.append((float(rec["t"]), int(rec["step"]), float(rec["loss"]), int(rec.get("attempt", 0))))
            except (ValueError, KeyError, TypeError):
                continue
    return sorted(out)


# --------------------------------------------------------------------------------------------
# The plot
# --------------------------------------------------------------------------------------------


def render_loss_png(data: ReportData, path: Path) -> None:
    """Two panels (loss over steps, loss over wall time) with restart and rollback markers.

    Raises ImportError when matplotlib is missing (the caller turns that into a note).
    """
    import matplotlib  # noqa: PLC0415 (optional dependency, loaded only to draw)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    points = _points(data)
    markers = restart_markers(data)
    t0_candidates = [p.wall_time for p in points]
    t0_candidates += [t for t in (_epoch(a.get("started_at")) for a in data.attempts) if t is not None]
    t0 = min(t0_candidates) if t0_candidates else 0.0

    fig, (ax_step, ax_time) = plt.subplots(2, 1, figsize=(11, 8), constrained_layout=True)
    cmap = plt.get_cmap("tab10")
    finite = [p.loss for p in points if math.isfinite(p.loss)]
    top = max(finite) if finite else 1.0
    attempts = sorted({p.attempt for p in points})
    nan_labelled = {id(ax_step): False, id(ax_time): False}
    for ax, xs_of in ((ax_step, lambda p: p.step), (ax_time, lambda p: p.wall_time - t0)):
        for a in attempts:
            series = [p for p in points if p.attempt == a]
            ok = [p for p in series if math.isfinite(p.loss)]
            bad = [p for p in series if not math.isfinite(p.loss)]
            color = cmap(a % 10)
            ax.plot([xs_of(p) for p in ok], [p.loss for p in ok], color=color, lw=1.2,
                    label=f"attempt {a}")
            if bad:
                # a non-finite loss cannot be plotted at its value: a red x at the top instead
                ax.scatter([xs_of(p) for p in bad], [top] * len(bad), marker="x", color="red",
                           zorder=5, label=None if nan_labelled[id(ax)] else "NaN/Inf loss")
                nan_labelled[id(ax)] = True
        ax.set_ylabel("loss")
        ax.grid(alpha=0.3)
    if finite and max(finite) / max(min(finite), 1e-9) > 30:
        for ax in (ax_step, ax_time):
            ax.set_yscale("log")

    for m in markers:
        color = "crimson" if m.is_rollback else "darkorange"
        if m.resume_step is not None:
            ax_step.axvline(m.resume_step, color=color, ls="--", lw=1)
            ax_step.annotate(m.label, xy=(m.resume_step, 1.0), xycoords=("data", "axes fraction"),
                             rotation=90, va="top", ha="right", fontsize=7, color=color)
            if m.is_rollback and m.previous_last_step is not None:
                ax_step.axvspan(m.resume_step, m.previous_last_step, color=color, alpha=0.08)
        if m.wall_time is not None:
            x = m.wall_time - t0
            ax_time.axvline(x, color=color, ls="--", lw=1)
            ax_time.annotate(f"restart {m.attempt} ({m.cause})", xy=(x, 1.0),
                             xycoords=("data", "axes fraction"), rotation=90, va="top", ha="right",
                             fontsize=7, color=color)
    # downtime between attempts, shaded on the wall-time panel
    ordered = sorted(data.attempts, key=lambda a: int(a.get("attempt", 0)))
    for prev, cur in zip(ordered, ordered[1:]):
        end, start = _epoch(prev.get("ended_at")), _epoch(cur.get("started_at"))
        if end is not None and start is not None and start > end:
            ax_time.axvspan(end - t0, start - t0, color="grey", alpha=0.15)

    ax_step.set_xlabel("step")
    ax_step.set_title(f"loss over steps: {data.run_id} (dashed: restarts; shaded: rolled-back steps)")
    ax_time.set_xlabel("wall time since start (s)")
    ax_time.set_title("loss over wall time (grey: downtime between attempts)")
    handles, labels = ax_step.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    if uniq:
        ax_step.legend(uniq.values(), uniq.keys(), fontsize=8, loc="upper right")
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# The page
# --------------------------------------------------------------------------------------------

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
    if isinstance(value, (Mapping, list, tuple)):
        return html.escape(json.dumps(value, default=str, sort_keys=True))
    return html.escape(str(value))


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
    start, end = _epoch(a.get("started_at")), _epoch(a.get("ended_at"))
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
    causes = [str(a.get("cause")) for a in data.attempts if a.get("cause")]
    if causes:
        facts["failures"] = ", ".join(causes)
    facts.update(data.summary)
    return _table(["", ""], ([html.escape(str(k)), _e(v)] for k, v in facts.items()))


def _timeline_bar(data: ReportData) -> str:
    spans = []
    for a in sorted(data.attempts, key=lambda a: int(a.get("attempt", 0))):
        start, end = _epoch(a.get("started_at")), _epoch(a.get("ended_at"))
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


def render_html(data: ReportData, png_bytes: bytes | None, png_note: str | None = None) -> str:
    points = _points(data)
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
             "rolled back steps"],
            ([("rollback" if m.is_rollback else "restart"), _e(m.attempt), _e(m.cause), _e(m.action),
              _e(m.resume_step if m.resume_step is not None else "scratch"), _e(m.previous_last_step),
              _e(m.previous_last_step - m.resume_step if m.is_rollback else 0)]  # type: ignore[operator]
             for m in markers),
        ))
    else:
        out.append("<p>No restarts: the run went through in one attempt.</p>")

    out.append("<h2>Attempt timeline</h2>")
    out.append(_timeline_bar(data))
    out.append(_table(
        ["attempt", "started", "ended", "duration", "exit code", "signal", "cause", "action",
         "checkpoint", "remedies"],
        ([_e(a.get("attempt")), _e(a.get("started_at")), _e(a.get("ended_at")), _duration(a),
          _e(a.get("exit_code")), _e(a.get("signal")), _e(a.get("cause")), _e(a.get("action")),
          _e(a.get("checkpoint")), _e(a.get("remedies") or "")]
         for a in sorted(data.attempts, key=lambda a: int(a.get("attempt", 0)))),
    ))

    out.append("<h2>Goodput</h2>")
    if data.goodput:
        g = data.goodput
        rows = [["productive", _e(g.get("productive_s")), ""]]
        lost = g.get("lost_s")
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
    out.mkdir(parents=True, exist_ok=True)
    png_path: Path | None = out / PNG_NAME
    png_bytes: bytes | None = None
    note: str | None = None
    try:
        render_loss_png(data, png_path)  # type: ignore[arg-type]
        png_bytes = png_path.read_bytes()  # type: ignore[union-attr]
    except ImportError as exc:
        note = f"matplotlib is not installed ({exc})"
        png_path = None
        log.warning("report_plot_skipped", reason=note, next="writing the HTML report without the plot")
    except Exception as exc:  # noqa: BLE001 (a plot failure must not lose the report)
        note = f"the plot failed: {type(exc).__name__}: {exc}"
        png_path = None
        log.warning("report_plot_failed", reason=note, next="writing the HTML report without the plot")
    html_path = out / HTML_NAME
    tmp = html_path.with_name(f".{HTML_NAME}.tmp")
    tmp.write_text(render_html(data, png_bytes, note), encoding="utf-8")
    tmp.replace(html_path)
    log.info("report_written", html=str(html_path), png=str(png_path) if png_path else None)
    return html_path, png_path


__all__ = [
    "Marker", "MetricPoint", "ReportData", "load_client_metrics", "render_html", "restart_markers",
    "write_report",
]
