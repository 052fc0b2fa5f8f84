"""Stopping the job: a timed state with one deadline per phase, never a blocking sleep.

::

    hybrid:   CHECKPOINT_WAIT --(new checkpoint | timeout)--> TERM_WAIT
    graceful:                                                 TERM_WAIT --(exit | grace)--> KILL_WAIT
    forced:                                                                                 KILL_WAIT --> DONE

``poll(now)`` advances the phases; the runner calls it every tick until ``done``. A second stop
request (a second SIGTERM) calls ``escalate`` and goes straight to KILL_WAIT.
"""

from __future__ import annotations

import signal
from enum import StrEnum
from typing import Callable, Protocol

import structlog

from ..core.messages import Mode, ShutdownPlan, ShutdownResult
from .osapi import signal_name

__all__ = ["Group", "Mode", "Phase", "Shutdown", "ShutdownPlan", "ShutdownResult"]

log = structlog.get_logger("supervisor.job.shutdown")


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
