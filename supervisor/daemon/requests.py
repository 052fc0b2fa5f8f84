"""The operator's requests on their way to the main loop. A control-server thread hands one over
with :func:`ask` and waits; the loop answers it with :func:`answer`. The verbs the state machine
answers become its events (:func:`machine_request`); status and reload the runner answers.
Signals (:func:`install_signal_handlers`) are only queued; the loop acts on them."""

from __future__ import annotations

import queue
import signal
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ..core.messages import CheckpointRequested, Event, RestartRequested, StopRequested
from ..errors import NotAnswered, UnknownVerb

if TYPE_CHECKING:
    from .ports import Notifier

VERBS = ("status", "restart", "stop", "checkpoint-now", "reload")
RUNNER_VERBS = frozenset({"status", "reload"})  # answered by the runner, not the machine
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD)


def install_signal_handlers(q: queue.SimpleQueue[tuple[Any, ...]]) -> None:
    """Each of :data:`SIGNALS` queued as ``("signal", number)`` (main thread only; elsewhere none)."""
    # Handlers only record (SimpleQueue.put is reentrant-safe); the loop decides.
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in SIGNALS:
        signal.signal(sig, lambda s, _f: q.put(("signal", s)))


def go_on(q: queue.SimpleQueue[tuple[Any, ...]], notifier: Notifier) -> Callable[[], bool]:
    """For a wait on the main loop (the checks at the end of a run): each call feeds systemd's
    watchdog and says whether to go on waiting: False once SIGTERM or SIGINT came (they stay
    queued, in order, for the loop): a stop is never held up by a check."""
    def keep() -> bool:
        notifier.watchdog()
        seen: list[tuple[Any, ...]] = []
        while True:
            try:
                seen.append(q.get_nowait())
            except queue.Empty:
                break
        for item in seen:
            q.put(item)
        return not any(item[0] == "signal" and item[1] in (signal.SIGTERM, signal.SIGINT) for item in seen)

    return keep


def ask(q: queue.SimpleQueue[tuple[Any, ...]], verb: str, args: Mapping[str, Any], timeout: float) -> Any:
    """From a control-server thread: queue the request for the main loop and wait for its answer."""
    fut: Future[Any] = Future()
    q.put(("control", verb, dict(args), fut))
    try:
        return fut.result(timeout=timeout)
    except TimeoutError:
        raise NotAnswered(f"the daemon's main loop did not answer {verb!r} within {timeout:g} s") from None


def answer(fut: Future[Any], handle: Callable[[], Any]) -> None:
    """On the main loop: the handler's result, or what it raised, back to the waiting thread."""
    try:
        fut.set_result(handle())
    except Exception as e:
        fut.set_exception(e)


def machine_request(verb: str, args: Mapping[str, Any], wall: float) -> Event:
    """The state machine's event for ``verb`` (one not in :data:`RUNNER_VERBS`)."""
    if verb == "stop":
        return StopRequested()
    if verb == "restart":
        return RestartRequested(str(args.get("reason") or "operator request"), args.get("from"),
                                bool(args.get("rollback")), wall)
    if verb == "checkpoint-now":
        return CheckpointRequested()
    raise UnknownVerb(f"unknown verb {verb!r}; known: {', '.join(VERBS)}")
