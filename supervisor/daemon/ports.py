"""The ports: every effect the runner has goes through one of these interfaces.

Real implementations: :class:`~supervisor.job.osapi.Clock`, :class:`~supervisor.daemon.adapters.ProcessLauncher`
(:class:`~supervisor.job.process.JobProcess`), :class:`~supervisor.ledger.store.Ledger`,
:class:`~supervisor.daemon.checkpointstore.CheckpointStorePort`,
:class:`~supervisor.daemon.healthconcern.LaunchGatePort`,
:class:`~supervisor.ops.notify.Notifier`. Small fakes for tests: ``tests/fakes.py``.

The parts of the daemon that react to the run (watchers, validation, goodput, checkpoints,
health, the control socket) are plug-ins (:mod:`supervisor.daemon.plugin`), not ports: they see
the run as a frozen :class:`~supervisor.daemon.plugin.RunView` and return effects.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Protocol, Sequence

from ..core.messages import ExitInfo, GateResult
from ..events import Action
from ..core.observations import MetricRecord

if TYPE_CHECKING:
    from ..config.model import Config
    from ..ledger.store import AttemptRow
    from .checkpointstore import Booked, Chosen
    from ..job.catchup import OutputLag
    from ..job.osapi import OsApi, ProcRef
    from ..job.process import LaunchSpec


class Clock(Protocol):
    """Monotonic time for deadlines, wall time for the ledger, and a sleep."""

    def monotonic(self) -> float: ...

    def time(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class Job(Protocol):
    """One running attempt: the leader, its process group, the pumps reading its pipes."""

    pid: int
    pgid: int
    leader: "ProcRef"
    status: int | None  # the leader's raw wait status once reaped

    @property
    def known(self) -> Mapping[int, "ProcRef"]:
        """Every descendant seen, with its start time (read-only here: the job keeps it)."""
        ...

    def refresh_tree(self, now: float) -> None: ...

    def reap_orphans(self) -> None: ...

    def poll(self) -> int | None: ...

    def group_alive(self) -> bool: ...

    def signal_group(self, sig: int) -> None: ...

    def pids(self) -> list[int]: ...

    def pumps_done(self, timeout: float = 0.0) -> bool: ...

    def output_lag(self) -> "OutputLag":
        """How far the handling of the job's output (console, parsers) is behind the job."""
        ...

    def cut_output(self) -> "OutputLag":
        """Stop handling the job's output (a stop's bounded catch-up is over); the lag when cut."""
        ...

    def close(self) -> None: ...


class JobLauncher(Protocol):
    def launch(self, spec: "LaunchSpec", log_path: Path | None, on_eof: Callable[[str], None]) -> Job:
        """Spawn the job in a session of its own; raises OSError when it cannot start."""
        ...

    def exit_info(self, job: Job, *, evidence: bool) -> ExitInfo:
        """How the leader ended; ``evidence``: look for OOM-killer evidence (kernel log, cgroup)."""
        ...

    def close(self) -> None:
        """The daemon exits: flush what is still on its way to the console (bounded wait)."""
        ...

    def discard_standby(self) -> None:
        """The job's config changed: a standby made for the old one ([job] prewarm) goes now."""
        ...

    def progressed(self, now: float) -> None:
        """The attempt showed a training step (``now``: monotonic): the next attempt's standby
        ([job] prewarm) starts once the attempt has run steadily."""
        ...

    def standby_status(self) -> dict[str, Any]:
        """``status``'s ``prewarm`` block: the standby's state, pid, rss and CPU seconds."""
        ...


class LedgerStore(Protocol):
    """The run ledger (all SQL lives in :mod:`supervisor.ledger.store`)."""

    # After open_run continued a run: the config table it was last started with (else None).
    continued_config: Any

    def open_run(self, name: str, config_json: Mapping[str, Any]) -> tuple[str, bool]: ...

    def end_run(self, run_id: str, state: str, exit_code: int, reason: str) -> None: ...

    def next_attempt_number(self, run_id: str) -> int: ...

    def begin_attempt(self, run_id: str, attempt: int, argv: list[str], cwd: str, env: Mapping[str, str],
                      snapshot: Mapping[str, Any] | None, checkpoint: str | None, resume_step: int | None,
                      remedies: list[Any], gate: Mapping[str, Any] | None) -> None: ...

    def set_attempt_process(self, run_id: str, attempt: int, pid: int, pgid: int, ctime: float) -> None: ...

    def update_attempt(self, run_id: str, attempt: int, **fields: Any) -> None: ...

    def end_attempt(self, run_id: str, attempt: int, *, exit_code: int | None, signal: str | None,
                    cause: str | None, action: str | None, summary: str, counted: bool = True,
                    detection: Mapping[str, Any] | None = None, decision: Mapping[str, Any] | None = None,
                    shutdown: Mapping[str, Any] | None = None, repeat: Mapping[str, Any] | None = None,
                    progressed: bool = False) -> None: ...

    def attempts(self, run_id: str) -> list["AttemptRow"]: ...

    def event(self, run_id: str, attempt: int | None, event: str, level: str, message: str | None,
              data: Mapping[str, Any] | None = None) -> None: ...

    def metrics_batch(self, run_id: str, attempt: int, rows: list[tuple[float, Any, Any, Any, Any, Any]]) -> None: ...

    def metrics(self, run_id: str) -> Iterator[Any]: ...

    def failure_record(self) -> tuple[float, int, list[float]]: ...

    def recent_step_times(self, run_id: str, limit: int = 5000) -> list[float]: ...

    def close(self) -> None: ...


class CheckpointStore(Protocol):
    """Where attempts resume from. ``choose`` and ``book_last_attempt`` run on the
    launch-preparation thread (they verify and may take seconds); each returns its result as a
    value, with the notes the caller hands to the runner."""

    def book_last_attempt(self) -> "Booked":
        """Book the last attempt against its checkpoint: those marked bad; a reason to give up on no progress."""
        ...

    def choose(self, cfg: "Config", action: Action, onset_step: int | None, explicit: str | None,
               metrics: Sequence[MetricRecord]) -> "Chosen":
        """Verify, quarantine, choose on ``cfg`` (the config in force when the launch was prepared)."""
        ...

    def ready_steps(self) -> dict[int, str]:
        """Step -> path of every checkpoint verified ready here (empty without a checkpoint dir);
        the previous attempt's writer is gone (the cluster's barrier publishes these)."""
        ...

    def emergency_checkpoint_probe(self) -> Callable[[], bool] | None:
        """For a hybrid stop: true once a new checkpoint appeared; None without a checkpoint dir."""
        ...


class GateVerdictLike(GateResult, Protocol):
    @property
    def waited_s(self) -> float: ...

    def to_dict(self) -> dict[str, object]: ...


class HealthGate(Protocol):
    def check(self, cfg: "Config", previous_pids: Sequence[int]) -> GateVerdictLike | None:
        """The pre-launch health gate on ``cfg`` (may wait for GPU memory); None when there is none."""
        ...


class Notifier(Protocol):
    """systemd's notify socket (a no-op outside systemd)."""

    def ready(self, status: str | None = None) -> bool: ...

    def reloading(self) -> bool: ...

    def stopping(self, status: str | None = None) -> bool: ...

    def status(self, text: str) -> bool: ...

    def watchdog(self, *, force: bool = False) -> bool: ...

    def extend_timeout(self, seconds: float) -> bool: ...


class EnvironmentProbe(Protocol):
    """What an attempt runs on: library versions of the job's Python, git state, host (probed
    once per daemon life, beside the first launch), plus the world size and what the monitors saw."""

    def start(self, cfg: "Config") -> None: ...

    def probed(self, wait: float = 0.0) -> Mapping[str, Any] | None: ...

    def of_attempt(self, spec: "LaunchSpec", extra: Mapping[str, Any]) -> dict[str, Any]: ...


@dataclass
class Ports:
    """Every effect the runner has, in one place (built by :mod:`supervisor.daemon.wiring`)."""

    clock: Clock
    launcher: JobLauncher
    ledger: LedgerStore
    checkpoints: CheckpointStore
    gate: HealthGate
    notifier: Notifier
    osapi: "OsApi"  # the process table, for a job group a previous daemon left running
    environment: EnvironmentProbe
