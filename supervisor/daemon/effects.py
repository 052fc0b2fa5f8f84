"""What a concern asks the daemon to write, as a value: the one write path for the fields of an
attempt's ledger row besides its launch and its end (:mod:`supervisor.daemon.attemptrows`).

A concern never writes the ledger itself: it hands an :class:`AttemptField` to
``DaemonView.apply``. On the main loop's thread it is written at once (in order with the attempt's
end, which follows it); from any other thread (a checkpoint verifier) it is a message, queued
and written by the main loop at its next turn, so that no field crosses threads through shared
attributes and a write is never lost to a run that ends first (``drain`` at close)."""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol


class AttemptUpdates(Protocol):
    """The one ledger call this needs (``LedgerStore`` has it; ports.py imports this module)."""

    def update_attempt(self, run_id: str, attempt: int, **fields: Any) -> None: ...


@dataclass(frozen=True)
class AttemptField:
    """Fields of attempt ``attempt``'s ledger row to set (only those given: None leaves a field as it is)."""

    attempt: int
    resume_step: int | None = None  # the step the checkpoint the job resumed from holds, read by its load test
    validation: Mapping[str, Any] | None = None  # post-reboot validation's verdict (or its incomplete state)
    snapshot: Mapping[str, Any] | None = None  # what the attempt runs on, at launch and at its end
    detection: Mapping[str, Any] | None = None  # the attempt's first failure

    def columns(self) -> dict[str, Any]:
        """The ledger columns this sets (``update_attempt``'s keywords)."""
        named = {"resume_step": self.resume_step, "validation_json": self.validation,
                 "snapshot_json": self.snapshot, "detection_json": self.detection}
        return {k: v for k, v in named.items() if v is not None}


class AttemptWriter:
    """Writes :class:`AttemptField` values into the run's ledger, from the main loop only.

    ``run_id``: the run's id at the time of the write; ``wake``: tells the main loop that a
    message from another thread waits (it writes it at its next turn, ``drain``)."""

    def __init__(self, ledger: AttemptUpdates, run_id: Callable[[], str], wake: Callable[[], None]) -> None:
        self.ledger = ledger
        self.run_id = run_id
        self.wake = wake
        self.loop_thread = threading.get_ident()  # the runner's thread (set again when it starts)
        self._from_threads: queue.SimpleQueue[AttemptField] = queue.SimpleQueue()

    def apply(self, effect: AttemptField) -> None:
        """From any thread: written now on the main loop, else handed to it as a message."""
        if threading.get_ident() == self.loop_thread:
            self._write(effect)
            return
        self._from_threads.put(effect)
        self.wake()

    def drain(self) -> None:
        """On the main loop: write what other threads handed over, in the order they did."""
        while True:
            try:
                effect = self._from_threads.get_nowait()
            except queue.Empty:
                return
            self._write(effect)

    def _write(self, effect: AttemptField) -> None:
        cols = effect.columns()
        if not cols:
            return
        # A failed write (a full disk) does not raise: the ledger logs it once, counts and drops it.
        self.ledger.update_attempt(self.run_id(), effect.attempt, **cols)
