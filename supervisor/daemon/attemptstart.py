"""How the runner starts an attempt, in the order it must happen: the attempt's ledger row, the
concerns told before the job can print its first line, the spawn (the environment probe started
beside the first one), then, once the machine has the job, its monitors, the snapshot of what it
runs on and the concerns told it started. The runner feeds the machine between the two halves
(``Spawned`` or ``SpawnFailed``); the launch preparation before them is :func:`prepare_launch`'s
worker thread, which drives the ports (the checkpoint store, the health gate)."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from ..config.model import Config
from ..core.messages import Launch, Prepared, PrepareLaunch
from ..events import AttemptContext
from ..core.observations import Detection, MetricRecord
from ..job.launch import heartbeat_dir, launch_spec
from ..job.process import LaunchSpec
from .recorder import Snapshots, begin_row
from .activity import AttemptActivity
from ..eventnames import EventName
from ..levels import Level
from .effects import Effect, Note
from .monitors import AttemptMonitors
from .plugin import AttemptSpawning, AttemptStarted, ConcernSet
from .ports import Job, Ports


def prepare_launch(cmd: PrepareLaunch, ports: Ports, cfg: Config, previous_pids: Sequence[int],
                   metrics: Sequence[MetricRecord], wake: Callable[[], None],
                   hand: Callable[[Effect], None]) -> Future[Prepared]:
    """Book the last attempt, run the health gate, choose the checkpoint, on a worker thread:
    hashing and load tests take seconds, and the main loop keeps answering signals, the control
    socket and the systemd watchdog meanwhile. ``wake`` tells the loop the result is ready; ``hand``
    gives it an effect to carry out (the gate's verdict, the store's notes: a message in its inbox,
    taken before the result)."""
    fut: Future[Prepared] = Future()

    def prepare() -> None:
        try:
            booked = ports.checkpoints.book_last_attempt()  # no progress: failures without a newer checkpoint
            for note in booked.notes():
                hand(note)
            if booked.no_progress:
                fut.set_result(Prepared(no_progress=booked.no_progress))
                return
            verdict = ports.gate.check(cfg, previous_pids)
            if verdict is not None:
                hand(Note(EventName.HEALTH_GATE, Level.INFO if verdict.passed else Level.ERROR,
                          f"pre-launch health gate: {verdict.summary()}", {"passed": verdict.passed,
                                                                           "waited_s": verdict.waited_s},
                          ledger_only=True))
            if verdict is not None and not verdict.passed:
                fut.set_result(Prepared(gate=verdict))
                return
            chosen = ports.checkpoints.choose(cfg, cmd.action, cmd.onset_step, cmd.explicit_checkpoint, metrics)
            for note in chosen.notes():  # what the choice met (quarantined, refused) and chose
                hand(note)
            fut.set_result(Prepared(resume=chosen.resume, gate=verdict))
        except BaseException as e:
            fut.set_result(Prepared(error=e))
        finally:
            wake()  # the loop launches at once, not at its next tick

    threading.Thread(target=prepare, name="launch-prepare", daemon=True).start()
    return fut


@dataclass(frozen=True)
class SpawnResult:
    """The job spawned (``job``) or why not (``error``), with the launch spec and when."""

    spec: LaunchSpec
    job: Job | None
    error: OSError | None
    now: float  # monotonic, right after the spawn
    wall: float


class AttemptStarter:
    def __init__(self, ports: Ports, concerns: ConcernSet, monitors: AttemptMonitors,
                 snapshots: Snapshots, activity: AttemptActivity, state_dir: Path,
                 on_eof: Callable[[str], None]) -> None:
        self.ports = ports
        self.concerns = concerns
        self.monitors = monitors
        self.snapshots = snapshots
        self.activity = activity
        self.state_dir = state_dir
        self.on_eof = on_eof  # a pipe of the job's reached its end: wakes the loop

    def spawn(self, cfg: Config, cmd: Launch, run_id: str) -> SpawnResult:
        """Record the attempt and spawn its job (an OSError is the result's ``error``, not raised)."""
        ports, clock = self.ports, self.ports.clock
        spec = launch_spec(cfg, cmd, run_id=run_id, state_dir=self.state_dir, job_env=self.concerns.job_env())
        begin_row(ports.ledger, run_id, cmd, spec)
        self.concerns.before_spawn(AttemptSpawning(cmd.attempt, cmd.resume))
        self.activity.reset(clock.monotonic(), clock.time())
        try:
            job = ports.launcher.launch(spec, cfg.log_file(), self.on_eof)
        except OSError as e:
            return SpawnResult(spec, None, e, clock.monotonic(), clock.time())
        finally:
            # Beside the first launch, not before it: the probe's interpreter would take a core
            # from the daemon's own way to the job's exec (issue 25 build 1). Once per daemon life.
            ports.environment.start(cfg)
        now, wall = clock.monotonic(), clock.time()
        ports.ledger.set_attempt_process(run_id, cmd.attempt, job.pid, job.pgid, job.leader.create_time)
        return SpawnResult(spec, job, None, now, wall)

    def started(self, cfg: Config, cmd: Launch, run_id: str, spawned: SpawnResult,
                emit: Callable[[Detection], None], history: Sequence[MetricRecord]) -> None:
        """After the machine took the job (``Spawned``): its monitors, its snapshot, the concerns told."""
        job, resume = spawned.job, cmd.resume
        assert job is not None
        ctx = AttemptContext(run_id, cmd.attempt, job.pgid, job.pid, spawned.now, self.state_dir,
                             heartbeat_dir(self.state_dir, cmd.attempt), cfg.checkpoint_dir(), resume.checkpoint,
                             resume.step)
        self.monitors.start(self.concerns.monitors(), ctx, emit)
        # Now the GPU/host monitors have looked at least once: record what the attempt runs on.
        self.snapshots.launched(cmd.attempt, self.ports.environment.of_attempt(spawned.spec, self.concerns.snapshots()))
        self.concerns.attempt_started(AttemptStarted(ctx, resume, spawned.wall, history))
        self.ports.notifier.ready()
