"""The runner's inbox: one queue of typed messages, many producers, one reader (the main loop).

Producers are any thread (monitors, the output keeper's link, a control-server thread, verifier
and probe threads) and the signal handler (``SimpleQueue.put`` is reentrant-safe, so a handler
only records). Each kind of message is one frozen class; the loop dispatches on the type
(``Runner._handle``), so a new kind is a type mypy checks, not a string tag a reader must know."""

from __future__ import annotations

import queue
import signal
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..core.observations import Detection
from .effects import Effect


@dataclass(frozen=True)
class SignalArrived:
    """A signal the handler recorded; the loop decides what it means."""

    number: int


@dataclass(frozen=True)
class DetectionArrived:
    """A monitor's detection, to be fed to the machine with the loop's clock."""

    detection: Detection


@dataclass(frozen=True)
class ControlAsked:
    """An operator's verb; the loop answers through ``reply`` (a control thread may wait on it)."""

    verb: str
    args: Mapping[str, Any]
    reply: Future[Any] = field(default_factory=Future, compare=False)


@dataclass(frozen=True)
class PipeEnded:
    """One of the job's pipes reached its end: wakes the loop, whose tick looks at the exit."""

    source: str


@dataclass(frozen=True)
class WakeUp:
    """Something the tick takes is ready (a prepared launch): wakes the loop."""


@dataclass(frozen=True)
class EffectHanded:
    """A plug-in's effect from another thread (a verifier, the environment probe): the loop carries it out."""

    effect: Effect


Message = SignalArrived | DetectionArrived | ControlAsked | PipeEnded | WakeUp | EffectHanded
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Inbox:
    """The queue itself: ``put`` from anywhere, ``get`` on the main loop only."""

    def __init__(self) -> None:
        self._q: queue.SimpleQueue[Message] = queue.SimpleQueue()

    def put(self, message: Message) -> None:
        self._q.put(message)

    def get(self, timeout: float | None = None) -> Message | None:
        """The next message, waiting at most ``timeout`` (None: not at all); None when there is none."""
        try:
            return self._q.get_nowait() if timeout is None else self._q.get(timeout=timeout)
        except queue.Empty:
            return None

    def take_all(self) -> list[Message]:
        out: list[Message] = []
        while (m := self.get()) is not None:
            out.append(m)
        return out

    def stop_signalled(self) -> bool:
        """Whether a SIGTERM or SIGINT waits; every message stays queued, in order, for the loop."""
        seen = self.take_all()
        for m in seen:
            self._q.put(m)
        return any(isinstance(m, SignalArrived) and m.number in STOP_SIGNALS for m in seen)
