"""What a plug-in asks the daemon to do, as values (:data:`Effect`): the runner carries each out,
on its main loop (``Runner.apply``); one returned or handed from another thread (a verifier, the
environment probe) is a message in the runner's inbox (``EffectHanded``), carried out when the loop
takes it, so nothing crosses threads through shared attributes and none is lost to a run that ends
first (the runner carries out what is left in its inbox at close). An attempt's fields
(:class:`AttemptField`) are the one write path of its ledger row besides its launch and its end
(:mod:`supervisor.daemon.recorder`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, assert_never

from ..core.observations import Detection
from ..eventnames import EventName
from ..levels import Level
from ..logsite import Site, callsite, log_helper

if TYPE_CHECKING:
    from ..config.model import Config


@dataclass(frozen=True)
class Note:
    """One daemon event: a log line (``ledger_only``: a module logged it already), a ledger row."""

    event: EventName
    level: Level
    message: str
    data: Mapping[str, Any] = field(default_factory=dict)
    ledger_only: bool = False
    site: Site | None = field(default_factory=callsite, compare=False, repr=False)  # the journal's CODE_*


log_helper(Note.__init__)  # the place a note was made is its maker's line, not the dataclass's __init__


@dataclass(frozen=True)
class Detect:
    """A detection for the machine, fed with the loop's clock like a monitor's."""

    detection: Detection


@dataclass(frozen=True)
class RequestCheckpoint:
    """Ask the job for a checkpoint as ``checkpoint-now`` does (a job not running refuses it)."""


@dataclass(frozen=True)
class UseConfig:
    """Run on ``cfg`` from the next turn on (what discovery found, applied as if configured)."""

    cfg: Config


@dataclass(frozen=True)
class RefreshStatus:
    """Build the status cache again now: ``status`` read right after a console line must show it."""


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


Effect = Note | Detect | AttemptField | RequestCheckpoint | UseConfig | RefreshStatus


@dataclass(frozen=True)
class Carrier:
    """How the runner carries out each kind of effect, on its main loop: one path per kind."""

    note: Callable[[Note], None]
    detect: Callable[[Detection], None]
    write: Callable[[AttemptField], None]
    request_checkpoint: Callable[[], None]
    use_config: Callable[[Config], None]
    refresh_status: Callable[[], object]

    def __call__(self, effect: Effect) -> None:
        match effect:
            case Note():
                self.note(effect)
            case Detect(d):
                self.detect(d)
            case AttemptField():
                self.write(effect)
            case RequestCheckpoint():
                self.request_checkpoint()
            case UseConfig(cfg):
                self.use_config(cfg)
            case RefreshStatus():
                self.refresh_status()
            case _:
                assert_never(effect)


class AttemptWriter:
    """Writes :class:`AttemptField` values into the run's ledger, from the main loop only
    (``run_id``: the run's id at the time of the write)."""

    def __init__(self, ledger: AttemptUpdates, run_id: Callable[[], str]) -> None:
        self.ledger = ledger
        self.run_id = run_id

    def write(self, effect: AttemptField) -> None:
        """On the main loop: the fields into the attempt's row."""
        cols = effect.columns()
        if not cols:
            return
        # A failed write (a full disk) does not raise: the ledger logs it once, counts and drops it.
        self.ledger.update_attempt(self.run_id(), effect.attempt, **cols)
