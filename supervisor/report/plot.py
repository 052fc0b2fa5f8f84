"""The loss curve of the run report as a PNG: loss over steps and over wall time, with a
marker at every restart and rollback.

matplotlib is an optional extra (``transformer-supervisor[report]``) and is imported only when a
report is drawn; :mod:`.page` turns its absence into a note on the page."""

from __future__ import annotations

import math
from pathlib import Path
from typing import BinaryIO

from .data import ReportData, epoch_seconds, metric_points, restart_markers




def render_loss_png(data: ReportData, path: Path | BinaryIO) -> None:
    """Two panels (loss over steps, loss over wall time) with restart and rollback markers.

    Raises ImportError when matplotlib is missing (the caller turns that into a note).
    """
    import matplotlib  # optional dependency, loaded only to draw

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = metric_points(data)
    markers = restart_markers(data)
    t0_candidates = [p.wall_time for p in points]
    t0_candidates += [t for t in (epoch_seconds(a.get("started_at")) for a in data.attempts) if t is not None]
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
            if m.steps_redone and m.previous_last_step is not None:  # the span trained again
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
        end, start = epoch_seconds(prev.get("ended_at")), epoch_seconds(cur.get("started_at"))
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
