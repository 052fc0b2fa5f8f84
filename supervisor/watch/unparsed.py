"""Lines that start like a metric record but gave none: counted and said, never dropped unsaid.

A job's JSON metric line that no reader could read (``{"step": 20, "loss": tensor(nan)}``, a line
past ``max_line_chars``, a loss written as text that is no number: :func:`.pyjson.unread_reason`)
used to vanish: the run ended "finished ... watched: stdout (json, 19 records)" over a NaN it never
saw. Now each is counted in the source's entry of the :class:`~.sources.SourceBook` (``status``'s
``metric_sources``, and the end of the run says the count), and the first of a source in each
attempt is said: a ``metric_lines_unread`` warning naming the source, the reason, a sample line
(through :func:`supervisor.redact.redact_line`) and what happens next. At most
:data:`MAX_SAID_PER_MIN` are said a minute over all sources; a source not said for that is said at
its next unread line. The log watcher holds one, under its lock.
"""

from __future__ import annotations

from typing import Callable

from ..levels import Level
from ..redact import redact_line
from .blind import Notice
from .pyjson import unread_reason
from .sources import SourceBook

#: Sources said per minute at most (a job with 32 metric files each unread must not flood the log).
MAX_SAID_PER_MIN = 5
#: Characters of the sample line shown.
SAMPLE_CHARS = 300


class UnreadLines:
    """Counts each unread line in ``book`` and words the notices (``take``)."""

    def __init__(self, book: SourceBook, clock: Callable[[], float]) -> None:
        self.book = book
        self.clock = clock
        self.attempt = 0
        self._said: set[str] = set()  # sources said this attempt
        self._said_at: list[float] = []  # when the notices of the last minute were said
        self._pending: list[Notice] = []

    def reset(self, attempt: int) -> None:
        """A new attempt: each source's first unread line is said again."""
        self.attempt = attempt
        self._said.clear()

    def line(self, source: str, line: str, max_chars: int) -> None:
        """An output line no parser read: counted and said if it starts like a JSON metric record."""
        why = unread_reason(line, max_chars, embedded=True)
        if why is not None:
            self.note(source, line, why)

    def note(self, source: str, line: str, why: str) -> None:
        """A line that starts like a metric record but gave none (``why``): counted, said if due."""
        state = self.book.note_unread(source)
        if source in self._said:
            return
        now = self.clock()
        self._said_at = [t for t in self._said_at if now - t < 60.0]
        if len(self._said_at) >= MAX_SAID_PER_MIN:
            return  # said at this source's next unread line, once the minute has room
        self._said_at.append(now)
        self._said.add(source)
        sample = redact_line(line.strip(), SAMPLE_CHARS)
        count = state.unread
        self._pending.append(Notice("metric_lines_unread", Level.WARNING, (
            f"{count} line{'s' if count != 1 else ''} of {source} start{'s' if count == 1 else ''} like a metric "
            f"record but gave none ({why}), so NaN, loss spikes and steps in {'it' if count == 1 else 'them'} are "
            f"NOT judged: {sample}. Watching goes on (its lines that read are judged as before); each such line is "
            "counted in status (metric_sources) and at the run's end. To have them judged, write them with "
            "json.dumps (NaN and Infinity are JSON's spellings) or name a [detectors.parsers] regexes pattern"),
            {"source": source, "reason": why, "sample": sample, "count": count}))  # the recorder adds the attempt
        if len(self._pending) > 16:  # nobody takes them (no main loop): keep the first, bounded
            del self._pending[16:]

    def take(self) -> list[Notice]:
        out, self._pending = self._pending, []
        return out


__all__ = ["MAX_SAID_PER_MIN", "UnreadLines"]
