"""Every cause of a failure, with everything the supervisor knows about it, in one entry.

The policy reads the default action and whether a failure spends the restart budget, the state
machine reads how to stop the job and whether the next attempts get diagnostics, and the docs
(``config.example.toml``, the table in docs/how-it-decides.md) are written from the doc lines. A new cause is a
member of :class:`Cause`, its :class:`CauseSpec` in :data:`CAUSES` (the import fails if one is
missing), and the detector that emits it (``docs/DEVELOPING.md`` has the steps).

    python -m supervisor.core.causes     # prints the table of docs/how-it-decides.md

Cause and action names are stable contracts: they appear in logs, the ledger, ``status`` and
config keys (``[on.<cause>]``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Mapping, Protocol, Sequence


class Action(StrEnum):
    """What the policy decides for a failure: the built-in actions, and those registered with
    :func:`new_action` (``Action("<name>")`` finds both)."""

    RESTART = "restart"  # relaunch from the last known good checkpoint
    ROLLBACK = "rollback"  # relaunch from the newest good checkpoint before the anomaly's onset
    GIVE_UP = "give_up"  # stop for good; the daemon exits 3
    WARN = "warn"  # record only; the job keeps running

    @classmethod
    def _missing_(cls, value: object) -> "Action | None":
        # An enum cannot gain members, so an action added outside this file is an Action instance
        # kept in _ADDED (what enum's own Flag does for its combined values): once it has a spec,
        # the config, the ledger's strings and the cluster's wire format parse it like a built-in one.
        added = _ADDED.get(value) if isinstance(value, str) else None
        return added if added is not None and added in _ACTION_SPECS else None


_ADDED: dict[str, Action] = {}


@dataclass(frozen=True)
class Hold:
    """A relaunch held until a condition clears (an action's :class:`ActionHandler` says so):
    the machine waits in ``held`` until a ``ConditionCleared`` event for ``cause`` arrives."""

    cause: Cause  # whose clearing releases the hold
    until: str  # in words, for the log and status: "disk_low clears"


class ActionHandler(Protocol):
    """An action's step that no :class:`ActionSpec` fact covers; the state machine calls it
    where the step happens (one method per step; none today but the hold)."""

    def hold(self, cause: Cause) -> Hold | None:
        """After the job stopped for ``cause``: hold the relaunch until what clears (None: the
        relaunch follows the backoff as usual)."""


@dataclass(frozen=True)
class ActionSpec:
    """What an action does, read by every consumer (the policy, the state machine, the shutdown
    plan, the checkpoint chooser, the cluster) instead of comparing action names.

    A new action is a member of :class:`Action` and its entry in :data:`ACTIONS` (the import
    fails if one is missing), or, outside this file, :func:`new_action` and :func:`register_action`;
    where it needs more than these facts, its :class:`ActionHandler` (``docs/DEVELOPING.md``,
    "Adding an action"; ``tests/core/test_action_recipe.py`` adds one)."""

    action: Action
    doc: str  # one line, for the config docs
    ends_attempt: bool  # the job is stopped (False: recorded only, the job keeps running)
    relaunches: bool  # a new attempt follows, through the ladder, the budget and the backoff
    before_onset: bool = False  # resume from the newest good checkpoint before the anomaly's onset
    #: a hybrid shutdown asks the job for an emergency checkpoint first (not worth it when the
    #: state is known bad, or when nothing will resume from it)
    emergency_checkpoint: bool = True
    #: the relaunch after it spends the restart budget and climbs the cause's remedy ladder
    #: (False: neither, like an operator's restart; the backoff still applies)
    counted: bool = True
    handler: ActionHandler | None = None  # its steps beyond these facts (None: none)


def _action_registry(specs: Sequence[ActionSpec]) -> dict[Action, ActionSpec]:
    table = {s.action: s for s in specs}
    missing = [a.value for a in Action if a not in table]
    if missing or len(table) != len(specs):
        raise ImportError(f"supervisor.core.causes: every Action needs exactly one ActionSpec; missing {missing}")
    return table


_ACTION_SPECS: dict[Action, ActionSpec] = _action_registry([
    ActionSpec(Action.RESTART, "stop the job and relaunch it from the newest good checkpoint",
               ends_attempt=True, relaunches=True),
    ActionSpec(Action.ROLLBACK, "stop the job and relaunch it from the newest good checkpoint before the onset",
               ends_attempt=True, relaunches=True, before_onset=True, emergency_checkpoint=False),
    ActionSpec(Action.GIVE_UP, "stop the job for good; the daemon exits 3",
               ends_attempt=True, relaunches=False, emergency_checkpoint=False),
    ActionSpec(Action.WARN, "record the failure only; the job keeps running",
               ends_attempt=False, relaunches=False),
])
#: Every action's spec, the built-in ones and those registered since (a read-only view).
ACTIONS: Mapping[Action, ActionSpec] = MappingProxyType(_ACTION_SPECS)
_ACTION_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")


def new_action(name: str) -> Action:
    """An action outside the built-in set (a plug-in's, or a test's stand-in): an :class:`Action`
    that ``Action(name)`` finds, in this process, once :func:`register_action` gave it its spec
    (docs/DEVELOPING.md, "Adding an action")."""
    if not _ACTION_NAME.match(name):
        raise ValueError(f"an action name is lower case letters, digits and _ (like give_up), got {name!r}")
    if name in Action._value2member_map_ or name in _ADDED:
        raise ValueError(f"an action named {name!r} exists already")
    member = str.__new__(Action, name)
    member._name_, member._value_ = name.upper(), name
    _ADDED[name] = member
    return member


def register_action(spec: ActionSpec) -> None:
    """Add the spec of an action made by :func:`new_action`; every consumer reads it from
    :data:`ACTIONS` from now on."""
    if spec.action in _ACTION_SPECS:
        raise ValueError(f"the action {spec.action.value!r} has a spec already")
    if _ADDED.get(spec.action.value) is not spec.action:
        raise ValueError(f"{spec.action.value!r} was not made by new_action()")
    _ACTION_SPECS[spec.action] = spec


def forget_action(action: Action) -> None:
    """Undo :func:`new_action` and :func:`register_action` (a test's stand-in, at its end);
    a built-in action cannot be forgotten."""
    if _ADDED.get(action.value) is not action:
        raise ValueError(f"{action.value!r} is a built-in action or was never added")
    _ACTION_SPECS.pop(action, None)
    del _ADDED[action.value]


def action_named(text: str) -> Action:
    """The action named ``text`` (built-in, or added with its spec); a ValueError that names the
    known ones otherwise (a config value, a ledger row, a cluster peer's request)."""
    try:
        return Action(text)
    except ValueError:
        known = ", ".join(a.value for a in _ACTION_SPECS)
        raise ValueError(f"unknown action {text!r} (known: {known})") from None


class Cause(StrEnum):
    """Why an attempt ended or must end (the SPEC's stable names); see :data:`CAUSES`."""

    CRASH = "crash"
    OOM = "oom"
    NAN = "nan"
    LOSS_SPIKE = "loss_spike"
    HANG = "hang"
    NCCL_TIMEOUT = "nccl_timeout"
    GPU_FAULT = "gpu_fault"
    GPU_MEMORY = "gpu_memory"
    CHECKPOINT_LOAD_ERROR = "checkpoint_load_error"
    VALIDATION_FAILED = "validation_failed"
    NO_PROGRESS = "no_progress"
    DISK_LOW = "disk_low"
    MANUAL = "manual"
    NODE_LOST = "node_lost"


class StopStyle(StrEnum):
    """How a job failing with the cause is stopped."""

    CONFIGURED = "configured"  # shutdown.mode and shutdown.grace_s
    HUNG = "hung"  # stacks dumped first, then graceful with shutdown.hang_grace_s: it flushes nothing


@dataclass(frozen=True)
class CauseSpec:
    cause: Cause
    default: Action  # the action unless [on.<cause>] action says otherwise
    doc: str  # one line: what the cause means (config docs, docs/how-it-decides.md)
    note: str = ""  # what the default does beyond its name (the causes table's "default" column)
    counted: bool = True  # spends the restart budget and books the attempt against its checkpoint
    stop: StopStyle = StopStyle.CONFIGURED
    diagnostics: bool = False  # the following attempts get validation.diagnostics_env
    #: a rollback relaunches at once: the detection itself proves the job is not stuck in a fast
    #: crash loop, and waiting buys nothing
    rollback_at_once: bool = False
    #: why any relaunch after this cause needs no backoff ("" : the backoff rules apply)
    no_backoff: str = ""

    def default_text(self) -> str:
        return self.default.value + (f" ({self.note})" if self.note else "")


def _registry(specs: Sequence[CauseSpec]) -> Mapping[Cause, CauseSpec]:
    table = {s.cause: s for s in specs}
    missing = [c.value for c in Cause if c not in table]
    if missing or len(table) != len(specs):
        raise ImportError(f"supervisor.core.causes: every Cause needs exactly one CauseSpec; missing {missing}")
    return MappingProxyType(table)


CAUSES: Mapping[Cause, CauseSpec] = _registry([
    CauseSpec(Cause.CRASH, Action.RESTART, "a non-zero exit, a killing signal or a CUDA error in the log (said with its message), nothing more specific seen"),
    CauseSpec(Cause.OOM, Action.RESTART, "CUDA or host out of memory (a log line, or the kernel OOM killer)"),
    CauseSpec(Cause.NAN, Action.ROLLBACK, "a non-finite training loss or grad norm value (a word in prose or a NaN only in an eval metric is a "
              "warning)", rollback_at_once=True),
    CauseSpec(Cause.LOSS_SPIKE, Action.ROLLBACK, "a persistent jump of the loss above its robust baseline",
              rollback_at_once=True),
    CauseSpec(Cause.HANG, Action.RESTART, "no heartbeat, step or output line for the timeout (or no first step)",
              note="stacks dumped first", stop=StopStyle.HUNG),
    CauseSpec(Cause.NCCL_TIMEOUT, Action.RESTART, "a collective or driver timeout seen in the log"),
    CauseSpec(Cause.GPU_FAULT, Action.RESTART, "an Xid, a double-bit ECC error, a GPU lost or a failed GPU gate",
              note='node-level Xid: give up, "drain or reset this node"'),
    CauseSpec(Cause.GPU_MEMORY, Action.WARN, "device memory above its watermark for too long (a forecast)"),
    CauseSpec(Cause.CHECKPOINT_LOAD_ERROR, Action.RESTART, "resuming failed: missing keys, wrong sizes, truncation",
              note="from the next older ready checkpoint",
              # Not a job that fails fast: its checkpoint was bad (no_progress_attempts still bounds
              # a run where every checkpoint fails).
              no_backoff="the checkpoint that failed to load is set aside; the next attempt resumes from another"),
    CauseSpec(Cause.VALIDATION_FAILED, Action.ROLLBACK, "the first steps after a resume disagree with the run before it",
              note="with diagnostics env", diagnostics=True),
    CauseSpec(Cause.NO_PROGRESS, Action.GIVE_UP, "attempts keep failing without a newer checkpoint"),
    CauseSpec(Cause.DISK_LOW, Action.WARN, "too little space for the next checkpoint, or a failed storage gate"),
    CauseSpec(Cause.MANUAL, Action.RESTART, "an operator asked (the restart verb)",
              note="not counted against the budget", counted=False),
    CauseSpec(Cause.NODE_LOST, Action.RESTART, "multi-node: a node's lease expired (daemon killed, node down, "
              "cut off from etcd)", note="every node stops; the run goes on with min_nodes"),
])


class GateCheck(StrEnum):
    """The checks of the pre-launch health gate; a failed gate is typed by the checks that failed."""

    GPU_SIGHT = "gpu_sight"  # the GPUs cannot be observed and gpu.require = true
    GPU_COUNT = "gpu_count"  # fewer GPUs than expected
    GPU_REPAIR = "gpu_repair"  # a GPU lost, or one needing a reset (pages, rows)
    GPU_MEMORY = "gpu_memory"  # the previous attempt's memory was not released
    STORAGE = "storage"  # the checkpoint storage probe failed


# What a failed gate becomes, by its first (root) failed check, and where a human should look.
GATE_FAILURES: Mapping[GateCheck, tuple[Cause, str]] = MappingProxyType({
    GateCheck.GPU_SIGHT: (Cause.GPU_FAULT, "the node (nvidia-smi, dmesg)"),
    GateCheck.GPU_COUNT: (Cause.GPU_FAULT, "the node (nvidia-smi, dmesg)"),
    GateCheck.GPU_REPAIR: (Cause.GPU_FAULT, "the node (nvidia-smi, dmesg)"),
    GateCheck.GPU_MEMORY: (Cause.GPU_FAULT, "the node (nvidia-smi, dmesg)"),
    GateCheck.STORAGE: (Cause.DISK_LOW, "the checkpoint storage (mounts, free space, permissions)"),
})


def gate_failure(failed: Sequence[GateCheck]) -> tuple[Cause, str]:
    """The cause of a failed gate and where to look: those of its first failed check (the gate
    runs the GPU checks before the storage probe, so storage alone means disk_low)."""
    return GATE_FAILURES[failed[0]] if failed else (Cause.GPU_FAULT, "the node (nvidia-smi, dmesg)")


README_BEGIN = "<!-- causes table: generated by `python -m supervisor.core.causes`; a test compares -->"
README_END = "<!-- end of causes table -->"


def readme_table() -> str:
    """The table of causes and their defaults (docs/how-it-decides.md)."""
    rows = ["| cause | default | what it is |", "|---|---|---|"]
    rows += [f"| `{s.cause.value}` | {s.default_text()} | {s.doc} |" for s in CAUSES.values()]
    return "\n".join(rows)


def config_doc_lines() -> list[str]:
    """The cause list of ``config.example.toml`` (comment lines)."""
    width = max(len(c.value) for c in Cause)
    return [f"#   {s.cause.value:<{width}}  {s.default.value:<8}  {s.doc}" for s in CAUSES.values()]


if __name__ == "__main__":
    print(readme_table())
