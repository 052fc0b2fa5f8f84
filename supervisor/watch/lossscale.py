"""The fp16 loss scale a record prints, and whether a streak of skipped steps is the scaler at work.

A dynamic loss scaler (AMP's GradScaler, DeepSpeed, Megatron) answers an overflow by skipping the
step and lowering the scale. Megatron starts at 2^32 and halves it every 2 overflows (hysteresis),
so a healthy fp16 warm-up is about 32 skipped steps in a row: counting them toward ``[detectors.nan]
overflow_steps`` (20) rolled the warm-up back, and the same warm-up after the rollback gave up on a
healthy run (issue 34, G9). So, where the record prints a loss scale: while it keeps falling the
scaler is working and the streak's count starts over (:meth:`ScaleStreaks.falling`); only records at
a scale that no longer falls (the same or a higher one), or at its floor (1, or the minimum the
record prints), count. Without a loss scale in the record the count is the plain streak.
"""

from __future__ import annotations

import math
import re

from ..core.observations import MetricRecord
from .nannotes import _SCALER_KEY

# Keys that name a scaler's setting, not its current scale: scale_window, min_loss_scale, growth_factor ...
_SETTING = re.compile(r"(?i)min|max|window|factor|growth|backoff|hysteres|interval|toleran")
_MIN = re.compile(r"(?i)min")

Stream = tuple[str, int | None]


def loss_scale(rec: MetricRecord) -> tuple[float | None, float]:
    """(the current loss scale the record prints or None, its floor): the floor is the minimum the
    record prints (``min_loss_scale``) where that is above 1, else 1 (a scale of 1 or below no longer
    scales anything up: lowering it cannot cure an overflow)."""
    scale: float | None = None
    floor = 1.0
    for key, v in rec.extra.items():
        if not _SCALER_KEY.search(key) or not math.isfinite(v):
            continue
        if _MIN.search(key):
            floor = max(floor, v)
        elif scale is None and not _SETTING.search(key):
            scale = v
    return scale, floor


class ScaleStreaks:
    """Per stream, the loss scale of the last skipped-step record of its streak, and the step
    since which the scale has not fallen (where the counted part of the streak begins)."""

    def __init__(self) -> None:
        self.last: dict[Stream, tuple[float, float, int | None]] = {}  # stream -> (scale, floor, since step)

    def falling(self, key: Stream, rec: MetricRecord, *, fresh: bool) -> bool:
        """True when ``rec``'s scale is lower than the previous record's of the streak and still
        above its floor: the scaler is working, and the streak's count starts over at ``rec``.
        ``fresh``: ``rec`` begins a streak (after a finite grad norm, or in a new attempt)."""
        if fresh:
            self.last.pop(key, None)
        scale, floor = loss_scale(rec)
        if scale is None:
            return False
        prev = self.last.get(key)
        fell = prev is not None and floor < scale < prev[0]
        since = rec.step if prev is None or scale != prev[0] else prev[2]
        self.last[key] = (scale, floor, since)
        return fell

    def details(self, key: Stream, count: int, fmt: str) -> dict[str, object]:
        """The detection's details, with the streak's last loss scale and its floor where printed."""
        known = self.last.get(key)
        scale = {} if known is None else {"loss_scale": known[0], "scale_floor": known[1]}
        return {"field": "grad_norm", "consecutive": count, "fmt": fmt, "overflow": True} | scale

    def summary(self, key: Stream, value: float, at: int | None, count: int, onset: int | None) -> str:
        """The detection's summary: what the evidence shows, and nothing it contradicts."""
        where = f" at step {at}" if at is not None else ""
        known = self.last.get(key)
        if known is None:
            return (f"grad_norm is {value}{where}, {count} records in a row since step {onset} with a finite loss "
                    "and no loss scale printed: past [detectors.nan] overflow_steps the loss scaler has skipped "
                    "every step without finding a scale that works, the run no longer trains")
        scale, floor, since = known
        if scale <= floor:
            return (f"grad_norm is {value}{where} with the loss scale at its floor ({scale:g} since step {since}; the "
                    f"floor is {floor:g}): {count} records in a row since it last fell (grad norms not finite since "
                    f"step {onset}), past [detectors.nan] overflow_steps: a lower scale cannot cure the overflow, the "
                    "run no longer trains")
        return (f"grad_norm is {value}{where} while the loss scale no longer falls (at {scale:g} since step {since}): "
                f"{count} records in a row without a lower scale (grad norms not finite since step {onset}), past "
                "[detectors.nan] overflow_steps: the loss scaler stopped lowering the scale, the run no longer trains")
