"""The monitors of the running attempt, started, polled and stopped together."""

from __future__ import annotations

from functools import partial
from typing import Callable, Sequence

from ..events import AttemptContext, Emit, Monitor


class AttemptMonitors:
    """A monitor that raises is reported once (``report``: an event) and disabled for the rest
    of the attempt; the job keeps running and the other monitors go on."""

    def __init__(self, report: Callable[..., None]) -> None:
        self.report = report
        self.active: list[Monitor] = []
        self.failed: set[str] = set()

    def start(self, monitors: Sequence[Monitor], ctx: AttemptContext, emit: Emit) -> None:
        self.failed.clear()
        self.active = list(monitors)
        for m in list(self.active):
            self._guard(m, "start", partial(m.start, ctx, emit))

    def poll(self, now: float) -> None:
        for m in list(self.active):
            self._guard(m, "poll", partial(m.poll, now))

    def catching_up(self) -> bool:
        """Whether a monitor still reads what the job wrote before its exit (a metric file's
        burst); each bounds its own wait. A monitor that fails here is not waited for."""
        for m in self.active:
            check = getattr(m, "catching_up", None)
            if check is None or m.name in self.failed:
                continue
            try:
                if check():
                    return True
            except Exception:  # a failing monitor never holds the end
                continue
        return False

    def stop(self) -> None:
        for m in self.active:
            self._guard(m, "stop", m.stop)
        self.active = []

    def _guard(self, m: Monitor, method: str, call: Callable[[], object]) -> None:
        """``call`` (``m``'s ``method``) unless ``m`` failed this attempt (``stop`` is always called)."""
        name = m.name
        if name in self.failed and method != "stop":
            return
        try:
            call()
        except Exception as e:
            if name not in self.failed:
                self.failed.add(name)
                self.report("monitor_failed", "error", f"monitor {name} failed in {method}: {e!r}; it is disabled "
                            "for this attempt, the job keeps running", monitor=name)
