"""Stopping the job, and how the loop sees the end of an attempt's job.

:class:`Shutdown` is the timed stop: a timed state with one deadline per phase, never a blocking
sleep::

    hybrid:   CHECKPOINT_WAIT --(new checkpoint | timeout)--> TERM_WAIT
    graceful:                                                 TERM_WAIT --(exit | grace)--> KILL_WAIT
    forced:                                                                                 KILL_WAIT --> DONE

``poll(now)`` advances the phases; the runner calls it every tick until ``done``. A second stop
request (a second SIGTERM) calls ``escalate`` and goes straight to KILL_WAIT.

:class:`JobStop` is the loop's side: the timed stop it started (polled each tick) and, once the
leader has exited, the short wait for the job's last output lines before the exit is taken as
final.
"""

from __future__ import annotations

import signal
from enum import StrEnum
from typing import Callable, Protocol

import structlog

from ..core.messages import Mode, ShutdownPlan, ShutdownResult, StopFinished, StopJob
from ..job.osapi import signal_name
from ..watch.metricfiles import EXIT_CATCH_UP_S
from .monitors import AttemptMonitors
from .ports import Clock, Job, Ports

__all__ = ["EXIT_DRAIN_S", "STOP_CATCH_UP_MIN_S", "Group", "JobStop", "Mode", "Phase", "Shutdown", "ShutdownPlan",
           "ShutdownResult"]

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


class Phase(StrEnum):
    CHECKPOINT_WAIT = "checkpoint_wait"
    TERM_WAIT = "term_wait"
    KILL_WAIT = "kill_wait"
    DONE = "done"


class Group(Protocol):
    def signal_group(self, sig: int) -> None: ...

    def group_alive(self) -> bool: ...


class Shutdown:
    def __init__(self, plan: ShutdownPlan, group: Group, now: float,
                 new_checkpoint: Callable[[], bool] | None = None,
                 on_extend: Callable[[float], object] | None = None) -> None:
        self.plan = plan
        self.group = group
        self.started = now
        self.new_checkpoint = new_checkpoint
        self.on_extend = on_extend  # systemd: EXTEND_TIMEOUT_USEC while we wait on a flush
        self.escalated = False
        self.checkpoint_seen: bool | None = None
        self.stragglers = False
        self.phase = Phase.DONE
        self.deadline = now
        if plan.mode is Mode.HYBRID and new_checkpoint is not None:
            self._enter_checkpoint_wait(now)
        elif plan.mode is Mode.FORCED:
            self._enter_kill(now)
        else:
            self._enter_term(now)

    # -- transitions ----------------------------------------------------------------------
    def _enter_checkpoint_wait(self, now: float) -> None:
        self.phase = Phase.CHECKPOINT_WAIT
        self.deadline = now + self.plan.checkpoint_timeout_s
        self.checkpoint_seen = False
        self.group.signal_group(self.plan.checkpoint_signal)
        log.info("shutdown_checkpoint_requested", signal=signal_name(self.plan.checkpoint_signal),
                 timeout_s=self.plan.checkpoint_timeout_s,
                 message=f"asked the job for an emergency checkpoint ({signal_name(self.plan.checkpoint_signal)}); "
                         f"waiting up to {self.plan.checkpoint_timeout_s:g} s for it, then stopping it")
        if self.on_extend:
            self.on_extend(self.plan.checkpoint_timeout_s + self.plan.grace_s + self.plan.kill_wait_s)

    def _enter_term(self, now: float) -> None:
        self.phase = Phase.TERM_WAIT
        self.deadline = now + self.plan.grace_s
        self.group.signal_group(self.plan.stop_signal)
        log.info("shutdown_signal_sent", signal=signal_name(self.plan.stop_signal), grace_s=self.plan.grace_s,
                 message=f"sent {signal_name(self.plan.stop_signal)} to the job's process group; "
                         f"SIGKILL in {self.plan.grace_s:g} s if it has not exited")
        if self.on_extend:
            self.on_extend(self.plan.grace_s + self.plan.kill_wait_s)

    def _enter_kill(self, now: float) -> None:
        if self.phase is Phase.TERM_WAIT:
            log.warning("shutdown_escalated", grace_s=self.plan.grace_s,
                        message=f"the job ignored {signal_name(self.plan.stop_signal)} for "
                                f"{self.plan.grace_s:g} s; sending SIGKILL to its process group")
        self.escalated = self.phase is not Phase.DONE or self.plan.mode is Mode.FORCED
        self.phase = Phase.KILL_WAIT
        self.deadline = now + self.plan.kill_wait_s
        self.group.signal_group(signal.SIGKILL)

    def escalate(self, now: float) -> None:
        """A second stop request: no more waiting."""
        if self.phase in (Phase.CHECKPOINT_WAIT, Phase.TERM_WAIT):
            log.warning("shutdown_forced", message="second stop request: killing the job's process group now")
            self._enter_kill(now)

    # -- progress -------------------------------------------------------------------------
    def poll(self, now: float) -> bool:
        """Advance; True once nothing of the group is left (or stragglers were reported)."""
        if self.phase is Phase.DONE:
            return True
        alive = self.group.group_alive()
        if not alive:
            self.phase = Phase.DONE
            return True
        if self.phase is Phase.CHECKPOINT_WAIT:
            assert self.new_checkpoint is not None
            if self.new_checkpoint():
                self.checkpoint_seen = True
                log.info("shutdown_checkpoint_seen", message="the emergency checkpoint is on disk; stopping the job")
                self._enter_term(now)
            elif now >= self.deadline:
                log.warning("shutdown_checkpoint_timeout", timeout_s=self.plan.checkpoint_timeout_s,
                            message=f"no emergency checkpoint appeared within {self.plan.checkpoint_timeout_s:g} s; "
                                    "stopping the job anyway (it resumes from the last one)")
                self._enter_term(now)
        elif self.phase is Phase.TERM_WAIT:
            if now >= self.deadline:
                self._enter_kill(now)
        elif self.phase is Phase.KILL_WAIT:
            if now >= self.deadline:
                self.stragglers = True
                log.error("shutdown_stragglers", message="processes of the job survived SIGKILL (likely stuck "
                                                         "in the kernel or GPU driver); continuing without them")
                self.phase = Phase.DONE
                return True
        return False

    def result(self, now: float) -> ShutdownResult:
        return ShutdownResult(self.plan.mode, self.escalated, self.checkpoint_seen, now - self.started,
                              self.stragglers)


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
