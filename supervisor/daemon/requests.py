"""The operator's requests on their way to the main loop. A control-server thread hands one over
with :func:`ask` and waits; the loop answers it with :func:`answer`. The verbs the state machine
answers become its events (:func:`machine_request`); status and reload the runner answers.
Signals (:func:`install_signal_handlers`) are only queued; the loop acts on them."""

from __future__ import annotations

import signal
import threading
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ..core.messages import CheckpointRequested, Event, RestartRequested, StopRequested
from ..errors import NotAnswered, UnknownVerb
from .inbox import ControlAsked, Inbox, SignalArrived

if TYPE_CHECKING:
    from .ports import Notifier

VERBS = ("status", "restart", "stop", "checkpoint-now", "reload")
RUNNER_VERBS = frozenset({"status", "reload"})  # answered by the runner, not the machine
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD)


def install_signal_handlers(inbox: Inbox) -> None:
    """Each of :data:`SIGNALS` queued as a :class:`SignalArrived` (main thread only; elsewhere none)."""
    # Handlers only record (SimpleQueue.put is reentrant-safe); the loop decides.
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in SIGNALS:
        signal.signal(sig, lambda s, _f: inbox.put(SignalArrived(s)))


def go_on(inbox: Inbox, notifier: Notifier) -> Callable[[], bool]:
    """For a wait on the main loop (the checks at the end of a run): each call feeds systemd's
    watchdog and says whether to go on waiting: False once SIGTERM or SIGINT came (they stay
    queued, in order, for the loop): a stop is never held up by a check."""
    def keep() -> bool:
        notifier.watchdog()
        return not inbox.stop_signalled()

    return keep


def ask(inbox: Inbox, verb: str, args: Mapping[str, Any], timeout: float) -> Any:
    """From a control-server thread: queue the request for the main loop and wait for its answer."""
    asked = ControlAsked(verb, dict(args))
    inbox.put(asked)
    try:
        return asked.reply.result(timeout=timeout)
    except TimeoutError:
        raise NotAnswered(f"the daemon's main loop did not answer {verb!r} within {timeout:g} s") from None


def answer(asked: ControlAsked, handle: Callable[[], Any]) -> None:
    """On the main loop: the handler's result, or what it raised, back to the waiting thread."""
    try:
        asked.reply.set_result(handle())
    except Exception as e:
        asked.reply.set_exception(e)


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
