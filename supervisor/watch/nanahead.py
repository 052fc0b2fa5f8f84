"""A NaN judged ahead of the in-order parsing: the lines the output reader found with a non-finite
value while it is seconds behind the job (:class:`~supervisor.job.catchup.LogAhead`), each with the
lines before it, judged now by a parser and a NaN detector of their own (pure: lines in, the
detection or None out). The log watcher keeps one ``nan`` per attempt, so the same line met again
in order adds nothing.

It only says what the in-order judgement would say: the detection is given only when the hit's
record names its own step (no step borrowed from a progress bar, no epoch-local counter, no loop
bar, no client metrics) and the lines before it hold a finite record of the same stream, so the
onset (the step after the last finite record) is the one the in-order detector finds. Anything
else is left to the in-order path, later but exact.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from ..core.observations import Detection, MetricRecord
from .config import DetectorsConfig
from .detectors import NanDetector
from .nannotes import has_nonfinite_value
from .parsers import MetricParser

# Records whose step the log watcher rewrites from its own state (a bar's position, an epoch-local
# counter, a loop bar after a resume) or whose format it renames: not judged ahead.
_IN_ORDER_ONLY = ("progress", "tqdm")


class NanAhead:
    """Judges a window of lines for the ``nan`` cause as the in-order NaN detector would."""

    def __init__(self, cfg: DetectorsConfig) -> None:
        self.cfg = cfg
        # Its own parser: the watcher's learns per source (CSV headers) in order, never out of it.
        self._parser = MetricParser(cfg.parsers.regexes, auto=cfg.parsers.auto,
                                    max_line_chars=cfg.parsers.max_line_chars)

    def judge(self, source: str, lines: Sequence[str]) -> Detection | None:
        """The detection of the window's last line (its hit), or None: not a NaN, or not sure.
        The hit line alone is parsed first: a line that only speaks of NaN ("(no nan)") costs one
        parse, and the lines before it are read only for a non-finite value (the onset's context)."""
        if not lines:
            return None
        hit = self._parser.parse(lines[-1], source)
        if hit is None or not has_nonfinite_value(hit):
            return None
        nan = NanDetector(self.cfg.nan, self.cfg.evidence_chars)  # fresh: only this window's records
        for line in lines:
            rec = self._parser.parse(line, source)
            if rec is None:
                continue
            if not _judged_ahead(rec):
                return None  # the in-order path would judge it with a step of its own making
            found = nan.observe(source, line, rec, rec.step)
            if found is not None:
                if nan.last_finite.get((source, rec.rank)) is None:
                    return None  # the onset may lie before the window: the in-order path knows it
                return replace(found, details={**found.details, "found_ahead_of_parsing": True})
        return None


def _judged_ahead(rec: MetricRecord) -> bool:
    return rec.step is not None and rec.fmt not in _IN_ORDER_ONLY and "epoch" not in rec.extra
