"""The monitors of the running attempt, started, polled and stopped together."""

from __future__ import annotations

from typing import Any, Callable, Sequence

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
            self._guard(m, "start", ctx, emit)

    def poll(self, now: float) -> None:
        for m in list(self.active):
            self._guard(m, "poll", now)

    def stop(self) -> None:
        for m in self.active:
            self._guard(m, "stop")
        self.active = []

    def _guard(self, m: Any, method: str, *args: Any) -> None:
        name = getattr(m, "name", type(m).__name__)
        if name in self.failed and method != "stop":
            return
        try:
            getattr(m, method)(*args)
        except Exception as e:
            if name not in self.failed:
                self.failed.add(name)
                self.report("monitor_failed", "error", f"monitor {name} failed in {method}: {e!r}; it is disabled "
                            "for this attempt, the job keeps running", monitor=name)
