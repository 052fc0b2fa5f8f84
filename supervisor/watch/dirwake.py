"""Wake a reader thread when a file in one of a few directories changes (inotify via watchdog).

The metric-file follower searches its tree about once a second; a file it already follows should
be read as soon as the job writes to it, so a NaN is judged within milliseconds, and before a job
that ends right after it has exited. Watches are non-recursive and only on the directories that
hold followed files (a handful), so a big working dir costs no inotify watches. Without watchdog or
with inotify exhausted, the poll alone remains (said once in the log).
"""

from __future__ import annotations

import threading
from typing import Any

import structlog

log = structlog.get_logger("supervisor.watch")

_EVENTS = frozenset({"modified", "created", "moved", "closed"})


class DirWake:
    """``watch(dir)`` once per directory; writes there set ``event``."""

    def __init__(self, event: threading.Event) -> None:
        self.event = event
        self._observer: Any = None
        self._handler: Any = None
        self._dirs: set[str] = set()
        self.error: str | None = None

    def start(self) -> None:
        if self._observer is not None or self.error is not None:
            return
        try:
            from watchdog.events import FileSystemEventHandler
            from watchdog.observers import Observer
        except ImportError as exc:
            self._unavailable(f"watchdog unavailable: {exc}")
            return
        wake = self.event

        class _Handler(FileSystemEventHandler):
            def on_any_event(self, event: Any) -> None:
                if event.event_type in _EVENTS and not event.is_directory:
                    wake.set()

        try:
            obs = Observer()
            obs.daemon = True
            obs.start()
        except Exception as exc:
            self._unavailable(repr(exc))
            return
        self._handler, self._observer = _Handler(), obs
        for d in list(self._dirs):
            self._schedule(d)

    def watch(self, directory: str) -> None:
        if directory in self._dirs:
            return
        self._dirs.add(directory)
        if self._observer is not None:
            self._schedule(directory)

    def _schedule(self, directory: str) -> None:
        try:
            self._observer.schedule(self._handler, directory, recursive=False)
        except Exception as exc:  # inotify limits: the poll reads it
            if self.error is None:
                self._unavailable(repr(exc))

    def _unavailable(self, error: str) -> None:
        self.error = error
        log.warning("metric_files_inotify_unavailable", error=error,
                    next="metric files are read at each poll only (about once a second)")

    def stop(self) -> None:
        obs, self._observer = self._observer, None
        if obs is not None:
            try:
                obs.stop()
                obs.join(timeout=5)
            except Exception:  # the observer thread owns its errors
                pass


__all__ = ["DirWake"]
