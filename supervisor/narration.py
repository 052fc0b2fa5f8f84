"""The daemon's events as sentences: the one narration of the demo's console and of ``run``/``wrap``
on a terminal.

``narrate`` turns the important events (detections with their evidence, decisions and what
happens next, checkpoint verifications, launches, validation, give-up) into the demo's lines::

    !! detected nan at step 120 (seen in stdout)
       evidence: step 120 loss nan
       decision: rolling back to the checkpoint before step 111 in 1.0 s
    >> attempt 2 launched, resuming from step 100 (step_000100.pt)

``console_text`` also says every other event, compactly (at the default level a terminal says
only the narrated ones, warnings and :data:`CONSOLE_KEPT`: :func:`said_at_default`) (its message, or its fields); ``stamp``
puts the time in front and indents continuation lines under the first. :class:`ConsoleRenderer`
is the structlog renderer ``logsetup`` uses for ``--log-format console``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from .eventnames import EventName as E
from .humanize import value as spell
from .textescape import Mode, escape

#: events whose own message is the narration, with the prefix that marks their kind
SAID_AS_IS: Mapping[str, str] = {
    E.RESTART_SCHEDULED: "   ", E.SHUTDOWN_ESCALATED: "   ",
    E.SHUTDOWN_CHECKPOINT_REQUESTED: "   ", E.SHUTDOWN_CHECKPOINT_SEEN: "   ", E.JOB_LEFTOVERS: "   ",
    E.STACKS_DUMPED: "   ", E.REMEDIES_APPLIED: "   ", E.VALIDATION_STARTED: "   ",
    E.VALIDATION_PASSED: "ok ", E.VALIDATION_FAILED: "!! ", E.CHECKPOINT_MARKED_BAD: "xx ",
    E.GAVE_UP: "XX ", E.DAEMON_EXITING: "== ", E.DETECTION_WARNED: "   (warning only) ",
    E.RUN_UNWATCHED: "!! ", E.CHECKPOINT_NONFINITE_AT_END: "XX ",
    E.MONITOR_FAILED: "!! internal: ", E.RUNNER_HANDLER_FAILED: "!! internal: ",
    E.RUNNER_TICK_FAILED: "!! internal: ", E.CONCERN_FAILED: "!! internal: ",
}

#: longest evidence said on the console (the journal and the ledger keep all of it)
EVIDENCE_CHARS = 150
#: a compact line's field values are cut here (an argv can be long)
VALUE_CHARS = 120
#: fields a compact line leaves out: said by the prefix and the stamp, or too long for a console
# (run_id is on every line of a run: the daemon_started line says it once)
_NOT_SAID = frozenset({"event", "level", "ts", "message", "summary", "next", "exception", "stack", "exc_info",
                       "stack_info", "run_id"})


def _name(path: object) -> str:
    return Path(str(path)).name


def narrate(ed: Mapping[str, Any]) -> str | None:
    """The demo's sentence for an event, or None for one it does not narrate. Continuation lines
    (evidence, decision) follow a newline; :func:`stamp` indents them."""
    ev = ed.get("event")
    msg = str(ed.get("message") or "")
    if ev == E.JOB_STARTED:
        ck = ed.get("checkpoint")
        where = f"resuming from step {ed.get('resume_step')} ({_name(ck)})" if ck else "from scratch"
        if ck and ed.get("handed") == "none":  # nothing is known to carry it to the job: claim no resume
            where = (f"checkpoint step {ed.get('resume_step')} ({_name(ck)}) in TSUP_RESUME_FROM only "
                     "(no resume flag known: it may start from scratch)")
        return f">> attempt {ed.get('attempt')} launched, {where}"
    if ev == E.FAILURE_DETECTED:
        out = f"!! detected {ed.get('cause')}" + (f" at step {ed['step']}" if ed.get("step") is not None else "")
        began = ed.get("onset_step") is not None and ed.get("onset_step") != ed.get("step")
        out += f" (began at step {ed['onset_step']}; seen in {ed.get('source')})" if began \
            else f" (seen in {ed.get('source')})"
        if ed.get("evidence"):
            out += f"\n   evidence: {str(ed['evidence'])[:EVIDENCE_CHARS]}"
        # The machine's message ends with what happens next ("...: <summary>; <what next>").
        return out + f"\n   decision: {msg.split('; ', 1)[-1]}"
    if ev in SAID_AS_IS:  # a module's own line without a message is said by the runner's twin
        return SAID_AS_IS[str(ev)] + msg if msg else None
    if ev == E.CHECKPOINT_QUARANTINED:
        return (f"xx checkpoint {_name(ed.get('path'))} failed verification ({ed.get('reason')}); "
                f"moved to {ed.get('dest')} (never deleted)")
    if ev == E.CHECKPOINT_CHOSEN:
        return f"ok verified {_name(ed.get('path'))} (step {ed.get('step')}): {ed.get('reason')}"
    if ev == E.CHECKPOINT_NONE_READY and "no checkpoints found" not in str(ed.get("reason")):
        return f"!! no ready checkpoint: {ed.get('reason')}"  # (none at all: "from scratch" says it)
    return None


#: info events a terminal shows at the default level although no sentence narrates them: what the
#: user did or must know once (the rest, state changes, gate passes, files followed, stay in the
#: ledger, the journal and ``--log-level debug``: a restart is 5 lines on a terminal, not 40)
CONSOLE_KEPT = frozenset({E.DAEMON_STARTED, E.CONFIG_RELOADED, E.STOP_REQUESTED, E.RESTART_REQUESTED,
                          E.SIGNAL_RECEIVED})


#: warnings a narrated event says again, better: the log watcher's own line of a detection (the
#: runner's failure_detected is the sentence with the evidence and the decision)
SAID_BY_TWIN = frozenset({E.ANOMALY_DETECTED})


def said_at_default(ed: Mapping[str, Any]) -> bool:
    """Whether a terminal at the default level (info) says the event: the narrated ones, every
    warning and error not said by a twin (:data:`SAID_BY_TWIN`), and :data:`CONSOLE_KEPT`."""
    if ed.get("event") in SAID_BY_TWIN:
        return False
    if str(ed.get("level") or "info") != "info":
        return True
    return ed.get("event") in CONSOLE_KEPT or narrate(ed) is not None


# What the job controls (evidence, a line, a file name) must not steer the user's terminal nor fool
# their eye: a "\r" in a job's line cannot overwrite our sentence, a "\n" cannot forge one, a
# RIGHT-TO-LEFT OVERRIDE cannot reorder it (supervisor/textescape.py says what is escaped and how).
#: values printed on lines of their own: our tracebacks, formatted below the sentence
_MULTILINE = frozenset({"exception", "stack"})


def terminal_safe(ed: Mapping[str, Any]) -> dict[str, Any]:
    """The event with every string value fit for a terminal (:data:`Mode.TERMINAL`; a traceback
    keeps its lines, :data:`Mode.FIELD`)."""
    return {k: (escape(v, Mode.FIELD if k in _MULTILINE else Mode.TERMINAL) if isinstance(v, str) else v)
            for k, v in ed.items()}


def _value(v: Any) -> str:
    text = spell(v)  # as logfmt spells it: passed=true, never Python's True
    return text if len(text) <= VALUE_CHARS else text[:VALUE_CHARS - 3] + "..."


def compact(ed: Mapping[str, Any]) -> str:
    """Any event on one line: ``   event_name: message`` (``!! `` for a warning or an error), or
    its summary, what happens next and its other fields (``key=value``, lists as JSON)."""
    level = str(ed.get("level") or "info")
    mark = "!! " if level in ("warning", "error", "critical") else "   "
    if ed.get("message"):
        return f"{mark}{ed.get('event')}: {ed['message']}"
    if ed.get("event") == E.STATE_CHANGED:
        return f"   state {ed.get('old')} -> {ed.get('new')} ({ed.get('why')})"
    said = "; ".join(str(ed[k]) for k in ("summary", "next") if ed.get(k))
    fields = " ".join(f"{k}={_value(v)}" for k, v in ed.items() if k not in _NOT_SAID and v is not None)
    return f"{mark}{ed.get('event')}" + (f": {said}" if said else "") + (f" ({fields})" if fields else "")


def console_text(ed: Mapping[str, Any]) -> str:
    """What the console says for an event: the narration, else the compact line; a traceback below."""
    text = narrate(ed) or compact(ed)
    for key in ("exception", "stack"):
        if ed.get(key):
            text += "\n" + str(ed[key]).rstrip("\n")
    return text


def stamp(prefix: str, text: str) -> str:
    """``[prefix] first line`` with the following lines indented under it."""
    head = f"[{prefix}] "
    first, *rest = text.split("\n")
    return "\n".join([head + first, *(" " * len(head) + line for line in rest)])


class ConsoleRenderer:
    """structlog's last processor for ``--log-format console``: ``[HH:MM:SS] sentence``. Expects
    the timestamp under ``ts_key`` (``HH:MM:SS``) and tracebacks already formatted
    (``logsetup.format_tracebacks``)."""

    def __init__(self, ts_key: str = "ts") -> None:
        self.ts_key = ts_key

    def __call__(self, _logger: Any, _name: str, ed: Mapping[str, Any]) -> str:
        return stamp(str(ed.get(self.ts_key, "")), console_text(terminal_safe(ed)))
