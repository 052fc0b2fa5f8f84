"""What the client verbs print for people: the ``status`` table (times said as "4 min 05 s ago,
at 14:02:11 CET"), and the ``history`` table of a run's attempts."""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

from ..humanize import duration, size, value as spell
from ..textescape import escaped


# -- text from the job or the filesystem ------------------------------------------------------

def escaped_lines(lines: list[str]) -> str:
    """Lines built from values the job or the filesystem chose, each kept one line (:func:`escaped`)."""
    return "\n".join(escaped(line) for line in lines)


# -- times people can read --------------------------------------------------------------------

def clock(t: float, now: float | None = None) -> str:
    """A wall time in local time: ``14:02:11 CET`` today, ``2026-12-01 14:02 CET`` otherwise."""
    now = time.time() if now is None else now
    lt = time.localtime(t)
    if time.strftime("%Y-%m-%d", lt) == time.strftime("%Y-%m-%d", time.localtime(now)):
        return time.strftime("%H:%M:%S %Z", lt)
    return time.strftime("%Y-%m-%d %H:%M %Z", lt)


def ago(seconds: float, now: float | None = None) -> str:
    now = time.time() if now is None else now
    return f"{duration(seconds)} ago, at {clock(now - seconds, now)}"


def ended_text(ended: Any, now: float | None = None) -> str:
    """When a run ended, from the ledger's ISO time (or a unix time): "4 min 05 s ago, at 14:02:11 CET"."""
    import datetime

    if isinstance(ended, (int, float)):
        t = float(ended)
    elif isinstance(ended, str) and ended:
        try:
            dt = datetime.datetime.fromisoformat(ended)
        except ValueError:
            return ended
        t = (dt if dt.tzinfo else dt.replace(tzinfo=datetime.timezone.utc)).timestamp()
    else:
        return "-"
    now = time.time() if now is None else now
    return ago(max(0.0, now - t), now)


def humane_status(result: Mapping[str, Any], now: float | None = None) -> dict[str, Any]:
    """The ``status`` result with its times said for people (the table renders it): ages and
    unix times become "4 min 05 s ago, at 14:02:11 CET", countdowns "in 3.0 s, at ..."."""
    now = time.time() if now is None else now
    out: dict[str, Any] = dict(result)
    lm = out.get("last_metric")
    if isinstance(lm, Mapping):
        age = lm.get("age_s")
        if age is None and isinstance(lm.get("at"), (int, float)):
            age = max(0.0, now - float(lm["at"]))
        keep = {k: v for k, v in lm.items() if k not in ("at", "fmt", "source", "age_s")}
        out["last_metric"] = {**keep, **({"age_s": age} if age is not None else {})}
    since = out.pop("seconds_since_last_good_checkpoint", None)
    newest = out.pop("newest_checkpoint", None)
    if isinstance(since, (int, float)):
        out["newest_good_checkpoint"] = (f"{newest}  " if newest else "") + f"(saved {ago(float(since), now)})"
    elif newest:
        out["newest_good_checkpoint"] = str(newest)
    wait = out.pop("restart_in_s", None)
    if isinstance(wait, (int, float)):
        out["restart_in"] = f"{duration(float(wait))}, at {clock(now + float(wait), now)}"
    gd = out.get("goodput_detail")
    if isinstance(gd, Mapping):
        lost = gd.get("lost_by_cause")
        if isinstance(lost, Mapping) and lost:
            out["lost_time"] = ", ".join(f"{k} {duration(float(v))}" for k, v in
                                         sorted(lost.items(), key=lambda kv: -float(kv[1] or 0)) if v)
        if isinstance(gd.get("total_s"), (int, float)):
            out["supervised_for"] = duration(float(gd["total_s"]))
    return out


def render_status(result: Mapping[str, Any]) -> str:
    """The ``status`` verb's table, its times said for people."""
    return status_table(humane_status(result))


def age_text(seconds: Any) -> str:
    try:
        s = float(seconds)
    except (TypeError, ValueError):
        return str(seconds)
    if s < 120:
        return f"{s:.1f}s"
    if s < 7200:
        return f"{s / 60:.1f}m"
    return f"{s / 3600:.1f}h"


def num_text(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return spell(v)  # true/false, compact JSON: as the log lines and the journal spell it


def gpu_line(g: Any) -> str:
    if not isinstance(g, Mapping):
        return str(g)
    idx = g.get("index", g.get("gpu", "?"))
    used = g.get("memory_used_bytes", g.get("memory_used"))
    total = g.get("memory_total_bytes", g.get("memory_total"))
    parts = [f"gpu{idx}"]
    if used is not None:
        parts.append(size(used) + (f" / {size(total)}" if total is not None else ""))
    for k in ("utilization", "temperature_c", "health"):
        if g.get(k) is not None:
            parts.append(f"{k}={num_text(g[k])}")
    return "  ".join(parts)


def metric_source_rows(result: Mapping[str, Any], rows: list[tuple[str, str]], shown: set[str]) -> None:
    """Where the metrics come from (one row per source, its last step and age), and a blind run's fix."""
    shown.update(("metric_sources", "metrics_blind"))
    sources = result.get("metric_sources")
    for i, src in enumerate(sources if isinstance(sources, list) else []):
        if isinstance(src, Mapping):
            step = src.get("last_step")
            rows.append(("metric sources" if i == 0 else "",
                         f"{src.get('source')}: {', '.join(map(str, src.get('formats') or []))}, "
                         f"{src.get('records')} records" + (f", step {step}" if step is not None else "")
                         + (f", {src['unread']} lines UNREAD (started like metric records)" if src.get("unread") else "")
                         + (f" ({age_text(src['age_s'])} ago)" if src.get("age_s") is not None else "")))
    blind = result.get("metrics_blind")
    if isinstance(blind, Mapping):
        rows.append(("metrics", f"BLIND: no training step parsed from {blind.get('lines')} lines in "
                                f"{blind.get('seconds')} s; NaN, spikes and progress are not watched"))
        rows.append(("", f"fix: {blind.get('fix')}"))


def status_table(result: Mapping[str, Any]) -> str:
    """A readable table of the ``status`` verb's result; renders whichever keys are present."""
    rows: list[tuple[str, str]] = []
    shown = set()

    def row(label: str, key: str, fmt: Callable[[Any], str] = num_text) -> None:
        shown.add(key)
        if key in result and result[key] is not None:
            rows.append((label, fmt(result[key])))

    shown.add("phase")
    phase = result.get("phase")
    row("state", "state", lambda v: f"{v} ({phase})" if phase and phase != v else str(v))
    row("run id", "run_id")
    row("attempt", "attempt")
    row("pids", "pids", lambda v: " ".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v))
    shown.add("restarts_by_cause")
    rbc = result.get("restarts_by_cause")
    if isinstance(rbc, Mapping):
        total = sum(int(v) for v in rbc.values() if isinstance(v, (int, float)))
        detail = ", ".join(f"{k} {v}" for k, v in sorted(rbc.items()) if v)
        rows.append(("restarts", f"{total}" + (f" ({detail})" if detail else "")))
    shown.add("last_metric")
    lm = result.get("last_metric")
    if isinstance(lm, Mapping):
        text = "  ".join(f"{k}={num_text(v)}" for k, v in lm.items() if v is not None and k != "age_s")
        if lm.get("age_s") is not None:
            text += f"  ({age_text(lm['age_s'])} ago)"
        rows.append(("last step", text))
    elif "last_metric" in result:
        rows.append(("last step", "(no metric seen yet)"))
    metric_source_rows(result, rows, shown)
    shown.add("end")
    end = result.get("end")
    if isinstance(end, Mapping):  # a job that exited 0: what was watched, its weights (core/runend.py)
        rows.append(("end", f"{end.get('verdict')}: {end.get('reason')}"))
    shown.add("output_lag")
    lag = result.get("output_lag")
    if isinstance(lag, Mapping) and (lag.get("seconds") or lag.get("unparsed_bytes")):
        text = (f"parsers {num_text(lag.get('seconds'))} s behind the job ({num_text(lag.get('bytes'))} bytes of the "
                "job log still to read; the job does not wait for them)")
        if lag.get("unparsed_bytes"):
            text += f"; {num_text(lag['unparsed_bytes'])} bytes could not be read back (output_unparsed)"
        rows.append(("output", text))
    shown.add("prewarm")
    pw = result.get("prewarm")
    if isinstance(pw, Mapping) and pw.get("state") not in (None, "off"):  # [job] prewarm's standby, its cost
        text = str(pw.get("state"))
        if pw.get("rss_bytes") is not None:
            text += f" (pid {pw.get('pid')}, {size(pw['rss_bytes'])} resident, {num_text(pw.get('cpu_s'))} CPU-s)"
        elif pw.get("reason"):
            text += f": {pw['reason']}"
        rows.append(("prewarm", text))
    shown.add("heartbeats")
    hb = result.get("heartbeats")
    if isinstance(hb, Mapping):
        rows.append(("heartbeats", "  ".join(f"rank{k} {age_text(v)} ago" for k, v in sorted(hb.items(), key=lambda kv: str(kv[0]).zfill(6)))
                     or "(none yet)"))
    shown.add("hang_timeout")
    ht = result.get("hang_timeout")
    if isinstance(ht, Mapping) and ht.get("timeout_from"):
        silent = f", silent {age_text(ht['silent_s'])}" if ht.get("silent_s") is not None else ""
        limit = f"{num_text(ht['timeout_s'])} s" if ht.get("timeout_s") is not None else "none"
        rows.append(("hang timeout", f"{limit} ({ht.get('signal')}{silent}): {ht.get('timeout_from')}"))
    shown.add("gpus")
    gpus = result.get("gpus")
    if isinstance(gpus, (list, tuple)):
        for i, g in enumerate(gpus):
            rows.append(("gpus" if i == 0 else "", gpu_line(g)))
    # One truth per line: "checkpoint" is what this attempt resumed from, not the newest good one;
    # both are named for what they are and shown together (a bare "(none yet)" beside a newest good
    # checkpoint three lines later read as a contradiction).
    shown.update(("checkpoint", "newest_good_checkpoint"))
    if "checkpoint" in result:
        rows.append(("resumed from", str(result["checkpoint"]) if result["checkpoint"] else "(nothing: a fresh start)"))
    if "checkpoint" in result or result.get("newest_good_checkpoint"):
        newest = result.get("newest_good_checkpoint")
        rows.append(("newest good checkpoint", str(newest) if newest else "(none yet)"))
    discovery_rows(result, rows, shown)
    row("goodput", "goodput", lambda v: f"{float(v) * 100:.1f} %" if isinstance(v, (int, float)) else str(v))
    shown.add("checkpoint_interval")
    ci = result.get("checkpoint_interval")
    if isinstance(ci, Mapping) and ci.get("summary"):
        rows.append(("interval", str(ci["summary"]).removeprefix("checkpoint interval: ")))
    shown.add("cluster")
    cl = result.get("cluster")
    if isinstance(cl, Mapping) and isinstance(cl.get("nodes"), Mapping):
        rows.append(("cluster", f"generation {cl.get('generation') or '-'}, leader {cl.get('leader') or '-'}, this node "
                                f"{cl.get('node_id')} (rank {cl.get('rank') if cl.get('rank') is not None else '-'})"
                     + ("" if cl.get("etcd_reachable", True) else "; etcd unreachable")))
        for name, node in cl["nodes"].items():
            if isinstance(node, Mapping):
                rows.append(("", f"{name}: {node.get('phase')}, generation {node.get('gen')}, {node.get('state') or '?'}"
                                 + (f" ({node['addr']})" if node.get("addr") else "")))
    for key, value in result.items():  # anything newer than this renderer
        if key not in shown and value is not None and not isinstance(value, (Mapping, list)):
            rows.append((key.replace("_", " "), num_text(value)))
    rows = [(escaped(label), value) for label, value in rows]
    width = max((len(label) for label, _ in rows), default=0)
    return escaped_lines([f"{label:<{width}}  {value}" for label, value in rows])


def discovery_rows(result: Mapping[str, Any], rows: list[tuple[str, str]], shown: set[str]) -> None:
    """Where the checkpoints are and how a checkpoint reaches the job (found or configured),
    and a resume the job ignored (supervisor.daemon.ckptdiscovery, resumewatch)."""
    shown.update(("checkpoint_dir", "resume", "resume_ignored"))
    cd = result.get("checkpoint_dir")
    if isinstance(cd, Mapping):
        how = "configured" if cd.get("found_by") == "config" else f"found by {cd.get('found_by')}"
        watching = ", ".join(map(str, cd.get("looking_under") or ()))
        rows.append(("checkpoint dir", f"{cd['path']}  ({how})" if cd.get("path")
                     else f"(not known yet: watching {watching} for checkpoints)"))
    rs = result.get("resume")
    if isinstance(rs, Mapping):
        args = " ".join(map(str, rs.get("args") or ()))
        rows.append(("resume", (f"{args}  ({rs.get('note')})" if args else str(rs.get("note") or "-"))))
    ri = result.get("resume_ignored")
    if isinstance(ri, Mapping):
        rows.append(("resume ignored", f"attempt {ri.get('attempt')}: resumed from step {ri.get('resume_step')}, "
                                       f"first step {ri.get('first_step')}"))


def render_history(h: dict[str, Any]) -> str:
    if h.get("run_id") is None:
        return "no runs recorded in this state dir yet"
    lines = [f"run {h['run_id']}  ({h.get('name')}; state {h.get('state')}"
             + (f", exit {h['exit_code']}" if h.get("exit_code") is not None else "") + ")"]
    if h.get("reason"):
        lines.append(f"  {h['reason']}")
    lines.append("")
    hdr = f"{'#':>3}  {'started (UTC)':<23}  {'ended':<12}  {'exit':<9}  {'cause':<22}  {'action':<9}  checkpoint"
    lines.append(hdr)
    lines.append("-" * len(hdr))
    for a in h["attempts"]:
        ex = (str(a["exit_code"]) if a["exit_code"] is not None else (a["signal"] or "-"))
        ended = (a["ended_at"] or "running")[11:23] if a["ended_at"] else "running"
        lines.append(f"{a['attempt']:>3}  {(a['started_at'] or '')[:23]:<23}  {ended:<12}  {ex:<9}  "
                     f"{(a['cause'] or '-'):<22}  {(a['action'] or '-'):<9}  {a['checkpoint'] or '-'}")
        if a.get("summary"):
            lines.append(f"     {a['summary']}")
        v = a.get("validation")
        if v:
            lines.append(f"     validation: {spell(v.get('verdict', v))}"
                         + (f" ({v['summary']})" if v.get("verdict") == "fail" and v.get("summary") else ""))
        if a.get("remedies"):
            lines.append(f"     remedies: {spell(a['remedies'])}")
        if a.get("prewarm"):
            lines.append(f"     prewarm: {spell(a['prewarm'])}")
    return escaped_lines(lines)
