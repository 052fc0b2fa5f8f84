"""How the loop sees the end of an attempt's job: the timed stop it started
(:class:`~supervisor.job.shutdown.Shutdown`, polled each tick) and, once the leader has exited,
the short wait for the job's last output lines before the exit is taken as final."""

from __future__ import annotations

from ..core.messages import StopFinished, StopJob
from ..job.shutdown import Shutdown
from .monitors import AttemptMonitors
from .ports import Clock, Job, Ports

EXIT_DRAIN_S = 1.0  # after the leader exits, how long to wait for the last output lines


class JobStop:
    def __init__(self, monitors: AttemptMonitors | None = None) -> None:
        self.monitors = monitors  # asked whether they still read what the job wrote before its exit
        self.shutdown: Shutdown | None = None  # the timed stop under way
        self.exit_seen_at: float | None = None  # when the loop first saw the job's exit (monotonic)

    def reset(self) -> None:
        """A new attempt's job: nothing stopping, no exit seen."""
        self.shutdown = self.exit_seen_at = None

    def begin(self, cmd: StopJob, job: Job, now: float, ports: Ports) -> None:
        """Start the timed stop; leftovers of an exited leader have no checkpoint to wait for."""
        if cmd.leftovers:
            self.shutdown = Shutdown(cmd.plan, job, now)
        else:
            self.shutdown = Shutdown(cmd.plan, job, now, ports.checkpoints.emergency_checkpoint_probe(),
                                     ports.notifier.extend_timeout)

    def escalate(self, now: float) -> None:
        if self.shutdown is not None:
            self.shutdown.escalate(now)

    def output_done(self, job: Job, now: float) -> bool:
        """The job's output is read to its end, or waited for long enough since its exit was seen.
        Output the job printed before its exit that the parsers are still catching up on (a burst
        the keeper left in job.log for them) is always waited for: its metrics are the attempt's;
        a straggler printing on after the exit is not (the wait would have no end)."""
        if self.exit_seen_at is None:
            self.exit_seen_at = now
        if self.monitors is not None and self.monitors.catching_up():
            return False  # a metric file's burst written before the exit: the attempt's too
        return job.pumps_done(0) or (now - self.exit_seen_at >= EXIT_DRAIN_S and not job.output_lag().draining)

    def draining(self, now: float) -> bool:
        """Still within :data:`EXIT_DRAIN_S` of the exit: the attempt's last metric records come first."""
        return now - (self.exit_seen_at or now) < EXIT_DRAIN_S

    def finished(self, job: Job, now: float, clock: Clock, ports: Ports) -> StopFinished | None:
        """The stop's end once its phases are over and the output is read; None until then."""
        if self.shutdown is None or not (self.shutdown.poll(now) and self.output_done(job, now)):
            return None
        job.poll()
        return StopFinished(ports.launcher.exit_info(job, evidence=False), self.shutdown.result(now), now,
                            clock.time())
