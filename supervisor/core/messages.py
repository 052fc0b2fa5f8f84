"""What the state machine speaks: the events fed into it and the commands it returns.

Events carry the time they happened (``now`` monotonic for deadlines, ``wall`` for the ledger)
and any random draw (``jitter``), so the machine never reads a clock or a random source. The
runner turns each command into effects through its ports, in the order given.
"""

from __future__ import annotations

import signal
import sys
from dataclasses import dataclass, field, fields, is_dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any, ClassVar, Mapping, Protocol, Sequence

from ..levels import Level
from .observations import Detection
from .policy import Decision, PastAttempt, RepeatKey
from .causes import Action, Cause, GateCheck
from .runend import EndFacts

EXIT_OK = 0
EXIT_GAVE_UP = 3


# ----------------------------------------------------------------------------- data
@dataclass(frozen=True)
class Activity:
    """What an attempt showed of its work besides parsed steps: the facts the progress rule of a
    blind attempt (no step parsed) judges (:func:`supervisor.core.attempts.showed_work`)."""

    lines: int = 0  # output lines it printed
    # The latest distinct whole seconds since its launch in which output arrived (at most
    # ACTIVE_SECONDS_KEPT, oldest first): steady work fills many, a start-up and a traceback few.
    active_s: tuple[int, ...] = ()
    files_changed_s: float | None = None  # its newest change in the checkpoint dir or watched files, s after launch


ACTIVE_SECONDS_KEPT = 64


@dataclass(frozen=True)
class ExitInfo:
    """How the job's leader process ended."""

    exit_code: int | None
    signal: str | None
    cause: Cause | None  # None: success (exit 0)
    summary: str
    oom_evidence: str | None = None
    # torchrun's (or a @record process's) first failure: rank, exception, message, last frame
    # (supervisor.job.torchelastic.RootCause.to_json); None when the job left no error file.
    root_cause: Mapping[str, Any] | None = None


class Mode(StrEnum):
    GRACEFUL = "graceful"
    FORCED = "forced"
    HYBRID = "hybrid"


@dataclass(frozen=True)
class ShutdownPlan:
    mode: Mode
    grace_s: float
    stop_signal: int = signal.SIGTERM
    checkpoint_signal: int = signal.SIGUSR1
    checkpoint_timeout_s: float = 300.0
    reason: str = ""
    # After SIGKILL, how long to wait for the group to vanish before reporting stragglers
    # (processes in uninterruptible sleep, e.g. stuck in the GPU driver).
    kill_wait_s: float = 30.0


@dataclass(frozen=True)
class ShutdownResult:
    mode: Mode
    escalated: bool  # SIGKILL was needed
    checkpoint_seen: bool | None  # hybrid: did the emergency checkpoint appear
    seconds: float
    stragglers: bool  # something survived even SIGKILL within kill_wait_s


@dataclass(frozen=True)
class Resume:
    """Where an attempt starts from: a checkpoint (and its step), or nothing, and why."""

    checkpoint: str | None
    step: int | None
    reason: str
    # The job is known to take the checkpoint: a resume flag carries it, or it reads
    # TSUP_RESUME_FROM. False: it is only in that variable, and no message may say "resuming".
    handed: bool = True


FRESH_START = Resume(None, None, "fresh start")


class GateResult(Protocol):
    """The pre-launch health gate's verdict, as the machine reads it (``health.GateVerdict``)."""

    @property
    def passed(self) -> bool: ...

    @property
    def failed_checks(self) -> tuple[GateCheck, ...]: ...

    def summary(self) -> str: ...


# ----------------------------------------------------------------------------- events
@dataclass(frozen=True)
class Boot:
    """The daemon is up: the attempts that ended before (a previous daemon life) and the next
    attempt number."""

    next_attempt: int = 0
    history: Sequence[PastAttempt] = ()


@dataclass(frozen=True)
class Prepared:
    """The launch preparation finished (gate, bookkeeping, checkpoint choice); exactly one of
    ``resume``, ``no_progress``, a failed ``gate`` or ``error`` says how."""

    resume: Resume | None = None
    gate: GateResult | None = None  # None: no gate configured
    no_progress: str | None = None  # why to give up: attempts keep failing without a newer checkpoint
    error: BaseException | None = None  # choosing a checkpoint raised


@dataclass(frozen=True)
class Spawned:
    pid: int
    pgid: int
    argv: Sequence[str]
    now: float


@dataclass(frozen=True)
class SpawnFailed:
    error: OSError
    argv: Sequence[str]
    cwd: str


@dataclass(frozen=True)
class FirstMetric:
    """A training metric arrived (the attempt is running, not only starting)."""


@dataclass(frozen=True)
class Detected:
    detection: Detection
    now: float
    wall: float
    jitter: float = 0.0  # in [-1, 1], for the backoff
    activity: Activity | None = None  # the attempt's work so far besides parsed steps


@dataclass(frozen=True)
class JobExited:
    """The job's leader exited by itself (its output drained); ``group_alive``: processes of its
    group remain."""

    info: ExitInfo
    group_alive: bool
    now: float
    wall: float
    last_step: int | None = None
    jitter: float = 0.0
    activity: Activity | None = None  # its work besides parsed steps (the progress of a blind attempt)


@dataclass(frozen=True)
class StopFinished:
    """Nothing of the job's group is left (or stragglers were reported)."""

    info: ExitInfo
    shutdown: ShutdownResult | None
    now: float
    wall: float


@dataclass(frozen=True)
class TimerFired:
    """The delay of the last :class:`ArmTimer` is over."""


@dataclass(frozen=True)
class StopRequested:
    signal: str | None = None  # "SIGTERM" when a signal asked, None for the control verb
    escalate_on_repeat: bool = True


@dataclass(frozen=True)
class RestartRequested:
    reason: str
    checkpoint: str | None
    rollback: bool
    wall: float


@dataclass(frozen=True)
class CheckpointRequested:
    pass


@dataclass(frozen=True)
class ConditionCleared:
    """What ``cause`` reported is over (the disk has room again, say): a relaunch held until it
    clears (:class:`~supervisor.core.causes.Hold`) goes ahead."""

    cause: Cause
    summary: str


@dataclass(frozen=True)
class EndChecked:
    """The answer to :class:`CheckEnd`: what was watched, the newest checkpoint's weights."""

    facts: EndFacts
    asked: CheckEnd  # its run time and end are the attempt's (the check's own seconds are not the job's)


Event = (Boot | Prepared | Spawned | SpawnFailed | FirstMetric | Detected | JobExited | StopFinished | TimerFired
         | StopRequested | RestartRequested | CheckpointRequested | ConditionCleared | EndChecked)


# ----------------------------------------------------------------------------- commands
@dataclass(frozen=True)
class PrepareLaunch:
    """Off the main loop: book the last attempt, run the gate, choose the checkpoint (rollback:
    the newest ready one before ``onset_step``); answer with :class:`Prepared`."""

    attempt: int
    action: Action
    onset_step: int | None
    explicit_checkpoint: str | None


@dataclass(frozen=True)
class Launch:
    """Record the attempt and spawn the job; answer with :class:`Spawned` or :class:`SpawnFailed`."""

    attempt: int
    resume: Resume
    gate: GateResult | None
    remedy_env: Mapping[str, str]
    remedy_args: Sequence[str]
    skip_batches: int
    diagnostics: bool  # add validation.diagnostics_env
    remedy_scale: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))  # flag -> factor on job.command's value


@dataclass(frozen=True)
class StopJob:
    """Stop the monitors and the job by ``plan``; answer with :class:`StopFinished` once it is gone."""

    plan: ShutdownPlan
    dump_stacks: bool = False  # save the stacks first (a hung job)
    leftovers: bool = False  # the leader is gone; only its group's leftovers are stopped


@dataclass(frozen=True)
class EscalateStop:
    """A second stop request: SIGKILL now."""


@dataclass(frozen=True)
class SignalJob:
    signal: int


@dataclass(frozen=True)
class ArmTimer:
    """Answer with :class:`TimerFired` after ``delay_s`` (counted from when this is carried out)."""

    delay_s: float


@dataclass(frozen=True)
class Argv:
    """A command line in an event's data. The core keeps the argv as it was exec'd: shown, it is
    bounded and its secrets masked by the sink's one redactor (redact.redact_argv), never here,
    since the redactor's learned secrets are process state the pure core does not hold."""

    args: tuple[str, ...]


@dataclass(frozen=True)
class Record:
    """One event: a log line and a ledger row (``ledger_only``: a module logged it already)."""

    event: str
    level: Level
    message: str
    data: Mapping[str, Any] = field(default_factory=dict)
    ledger_only: bool = False
    #: (file, line, function) that made it, for the journal's CODE_* fields: the runner logs it
    #: later, elsewhere. Not a field: not compared, not in the ledger.
    origin: ClassVar[tuple[str, int, str] | None] = None

    def __post_init__(self) -> None:
        f: Any = sys._getframe(1)  # past dataclass's __init__ and the machine's one-line _record helper
        while f is not None and f.f_code.co_name in ("__init__", "_record"):
            f = f.f_back
        if f is not None:
            object.__setattr__(self, "origin", (f.f_code.co_filename, f.f_lineno, f.f_code.co_name))


@dataclass(frozen=True)
class StateChanged:
    old: str
    new: str
    why: str
    attempt: int


@dataclass(frozen=True)
class RecordDetection:
    """The failure that ends the attempt, into its ledger row."""

    attempt: int
    detection: Detection


@dataclass(frozen=True)
class EndAttempt:
    """The attempt is over: close its ledger row, tell the concerns (goodput, validation,
    checkpoint bookkeeping) and release the job (``spawned`` false: it never started)."""

    attempt: int
    cause: Cause | None
    action: Action | None
    summary: str
    counted: bool
    exit_code: int | None = None
    signal: str | None = None
    detection: Detection | None = None
    decision: Decision | None = None
    shutdown: ShutdownResult | None = None
    spawned: bool = True
    # Kept in the ledger so that a restarted daemon still sees an identical repeat (no third
    # identical attempt across daemon lives) and the backoff streak.
    repeat: RepeatKey | None = None
    progressed: bool = False


@dataclass(frozen=True)
class CheckEnd:
    """The job exited 0 with no failure seen: gather what was watched and check the newest
    checkpoint's weights; answer with :class:`EndChecked` (supervisor.core.runend)."""

    attempt: int
    ran_s: float
    wall: float  # when the job ended: the last step is said as seconds before it


@dataclass(frozen=True)
class Finish:
    """The daemon exits with ``code``."""

    state: str
    code: int
    reason: str


@dataclass(frozen=True)
class Reply:
    """The answer to a control request."""

    result: Mapping[str, Any]


Command = (PrepareLaunch | Launch | StopJob | EscalateStop | SignalJob | ArmTimer | Record | StateChanged
           | RecordDetection | EndAttempt | CheckEnd | Finish | Reply)


# ----------------------------------------------------------------------------- JSON shapes
def jsonable(v: Any) -> Any:
    """Dataclasses, mappings, sequences and enums as plain JSON types; an :class:`Argv` is left to
    the sink's redactor, which shows it as a list."""
    if isinstance(v, Argv):
        return v
    if is_dataclass(v) and not isinstance(v, type):
        return {f.name: jsonable(getattr(v, f.name)) for f in fields(v)}
    if isinstance(v, Mapping):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, StrEnum):
        return v.value
    return v


def detection_dict(d: Detection) -> dict[str, Any]:
    return {"cause": d.cause.value, "summary": d.summary, "source": d.source, "step": d.step,
            "onset_step": d.onset_step, "value": d.value, "evidence": d.evidence,
            "details": jsonable(d.details), "at": d.at}
