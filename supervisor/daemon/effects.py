"""What a concern asks the daemon to write, as a value: the one write path for the fields of an
attempt's ledger row besides its launch and its end (:mod:`supervisor.daemon.attemptrows`).

A concern never writes the ledger itself: it hands an :class:`AttemptField` to
``DaemonView.apply``. On the main loop's thread it is written at once (in order with the attempt's
end, which follows it); from any other thread (a checkpoint verifier) it is a message in the
runner's inbox (``EffectHanded``), written by the main loop when it takes it, so that no field
crosses threads through shared attributes and a write is never lost to a run that ends first (the
runner writes what is left in its inbox at close)."""

from __future__ import annotations

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

    ``run_id``: the run's id at the time of the write; ``hand_over``: puts a field from another
    thread in the main loop's inbox (the loop then calls ``write``)."""

    def __init__(self, ledger: AttemptUpdates, run_id: Callable[[], str],
                 hand_over: Callable[[AttemptField], None]) -> None:
        self.ledger = ledger
        self.run_id = run_id
        self.hand_over = hand_over
        self.loop_thread = threading.get_ident()  # the runner's thread (set again when it starts)

    def apply(self, effect: AttemptField) -> None:
        """From any thread: written now on the main loop, else handed to it as a message."""
        if threading.get_ident() == self.loop_thread:
            self.write(effect)
        else:
            self.hand_over(effect)

    def write(self, effect: AttemptField) -> None:
        """On the main loop: the fields into the attempt's row."""
        cols = effect.columns()
        if not cols:
            return
        # A failed write (a full disk) does not raise: the ledger logs it once, counts and drops it.
        self.ledger.update_attempt(self.run_id(), effect.attempt, **cols)
