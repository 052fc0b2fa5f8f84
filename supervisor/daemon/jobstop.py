"""How the loop sees the end of an attempt's job: the timed stop it started
(:class:`~supervisor.job.shutdown.Shutdown`, polled each tick) and, once the leader has exited,
the short wait for the job's last output lines before the exit is taken as final."""

from __future__ import annotations

import structlog

from ..core.messages import StopFinished, StopJob
from ..job.shutdown import Shutdown
from ..watch.metricfiles import EXIT_CATCH_UP_S
from .monitors import AttemptMonitors
from .ports import Clock, Job, Ports

log = structlog.get_logger("supervisor.daemon.jobstop")

EXIT_DRAIN_S = 1.0  # after the leader exits, how long to wait for the last output lines
#: A stop's catch-up on output the job printed before it ended (a flood the keeper left in
#: job.log) gets the rest of the grace, at least this, at most :data:`EXIT_CATCH_UP_S`: a stop
#: then ends within about max(grace + kill wait, the job's end + 3 s), which a scheduler's kill
#: wait (Slurm's KillWait, 30 s) allows for when the grace fits it; unbounded, 2.7 GB of backlog
#: held the exit 81 s and the scheduler's SIGKILL came before the run's end was recorded. 3 s
#: (3x EXIT_DRAIN_S) reads the last lines of a job that printed at a normal rate, and tens of MB of
#: a flood's backlog; the rest is in job.log.
STOP_CATCH_UP_MIN_S = 3.0


class JobStop:
    def __init__(self, monitors: AttemptMonitors | None = None) -> None:
        self.monitors = monitors  # asked whether they still read what the job wrote before its exit
        self.shutdown: Shutdown | None = None  # the timed stop under way
        self.exit_seen_at: float | None = None  # when the loop first saw the job's exit (monotonic)
        self.catch_up_until: float | None = None  # a stop's bound on the output catch-up (monotonic)

    def reset(self) -> None:
        """A new attempt's job: nothing stopping, no exit seen."""
        self.shutdown = self.exit_seen_at = self.catch_up_until = None

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

    def stop_caught_up(self, job: Job, now: float) -> bool:
        """:meth:`output_done`, bounded: a stop must end on time (the operator's, a scheduler's
        SIGTERM, a give-up), so past :data:`STOP_CATCH_UP_MIN_S` or the rest of the grace the
        output not handled yet is left in job.log, unparsed, and that is said once."""
        assert self.shutdown is not None
        if self.catch_up_until is None:
            rest = self.shutdown.started + self.shutdown.plan.grace_s - now
            self.catch_up_until = now + min(EXIT_CATCH_UP_S, max(STOP_CATCH_UP_MIN_S, rest))
        if self.output_done(job, now):
            return True
        if now < self.catch_up_until:
            return False
        lag = job.cut_output()
        waited = now - (self.exit_seen_at or now)
        log.warning("output_catch_up_cut", unread_bytes=lag.bytes, behind_s=round(lag.seconds, 3),
                    waited_s=round(waited, 3),
                    message=f"the job is stopped, but the daemon was still {lag.seconds:.1f} s behind its output "
                            f"({lag.bytes} bytes not handled) after waiting {waited:.1f} s; those bytes are in "
                            "job.log (nothing is lost) but are neither parsed nor shown on the console; the "
                            "daemon records the attempt's end and goes on now rather than outlive a "
                            "scheduler's kill wait")
        return True

    def draining(self, now: float) -> bool:
        """Still within :data:`EXIT_DRAIN_S` of the exit: the attempt's last metric records come first."""
        return now - (self.exit_seen_at or now) < EXIT_DRAIN_S

    def finished(self, job: Job, now: float, clock: Clock, ports: Ports) -> StopFinished | None:
        """The stop's end once its phases are over and the output is read, or its bounded wait for
        that is over (:meth:`stop_caught_up`); None until then."""
        if self.shutdown is None or not (self.shutdown.poll(now) and self.stop_caught_up(job, now)):
            return None
        job.poll()
        return StopFinished(ports.launcher.exit_info(job, evidence=False), self.shutdown.result(now), now,
                            clock.time())
