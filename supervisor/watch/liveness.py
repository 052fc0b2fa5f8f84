"""Is the job alive? Learned timeouts, and liveness from the job's own output.

Two pure pieces, driven by the heartbeat monitor with the main loop's monotonic clock:

:class:`Cadence` learns a timeout from observed intervals, as NVIDIA's resiliency extension
does: ``initial_timeout_s`` until ``learn_after`` intervals were seen, then ``max(learn_floor_s,
longest interval x learn_factor)``; a configured ``timeout_s`` overrides both. What was learned
carries over to later attempts of the run. Client heartbeats and printed steps each have one.

:class:`OutputLiveness` judges a job that sends no client heartbeats (most jobs: an unmodified HF
Trainer, Lightning or nanoGPT script) by what it prints:

- *steps*: once the run has printed training steps we can parse (a metric line with a new step,
  a trainer's progress bar), the job is hung when for the timeout it prints **no new step and no
  line at all**. Any line resets the clock, so an evaluation or a checkpoint save that prints
  (HF's eval bar, "Writing model shards") never looks like a hang; a silent one is covered by the
  learned timeout, which is learned from the gaps between new steps, long eval and save pauses
  included, so once one has been seen it is allowed for from then on. Files being written in
  the checkpoint dir count as activity too (a large save prints nothing for minutes), and a hang
  declared by a *learned* timeout teaches as well: the silence that fired counts as an interval,
  so a pause mistaken once (a first, silent evaluation longer than the floor) is allowed for
  after the restart instead of looping. Before the attempt's first
  new step the startup allowance applies (``startup_timeout_s``: imports, model load, compile,
  rendezvous), never the learned step rhythm.
- *output*: a job whose lines never parse as steps has no rhythm we can trust: a burst of start-up
  lines followed by hours of silent training (logging only to wandb) is normal. Only an explicit
  ``timeout_s`` applies then (no line for that long after its first line); without one, output
  liveness stays off for that job and the monitor says so once.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import HeartbeatConfig


class Cadence:
    """A timeout learned from the intervals of one signal (heartbeats, or printed steps)."""

    def __init__(self, cfg: HeartbeatConfig) -> None:
        self.cfg = cfg
        self.intervals = 0
        self.max_interval = 0.0

    def add(self, interval: float) -> None:
        if interval > 0:
            self.intervals += 1
            self.max_interval = max(self.max_interval, interval)

    @property
    def learned(self) -> bool:
        return self.intervals >= self.cfg.learn_after

    def timeout(self) -> tuple[float, str]:
        """The timeout in force and where it comes from: ``config``, ``learned`` or ``initial``."""
        if self.cfg.timeout_s is not None:
            return self.cfg.timeout_s, "config"
        if self.learned:
            return max(self.cfg.learn_floor_s, self.max_interval * self.cfg.learn_factor), "learned"
        return self.cfg.initial_timeout_s, "initial"


@dataclass(frozen=True)
class Silence:
    """A judged hang of a job without heartbeats: what it printed last and for how long nothing."""

    kind: str  # "steps" (no new step and no line) or "output" (no line) or "startup"
    silent_s: float
    timeout_s: float
    timeout_source: str  # config / learned / initial / startup
    last_step: int | None
    last_line: str | None

    def summary(self) -> str:
        what = {"steps": "no new training step and no output line",
                "output": "no output line",
                "startup": "no training step since the launch"}[self.kind]
        step = f"; last step {self.last_step}" if self.last_step is not None else ""
        return f"{what} for {self.silent_s:.1f} s (timeout {self.timeout_s:g} s, {self.timeout_source}){step}"


class OutputLiveness:
    """Liveness from the job's output, for jobs without client heartbeats (see module doc).

    ``start(now)`` per attempt; ``line(now, text)`` for every batch of output (the last line);
    ``step(now, step)`` for every new training step (``step`` may be None for a stepless metric
    line); ``check(now)`` returns a :class:`Silence` when the job is hung, else None.
    """

    def __init__(self, cfg: HeartbeatConfig) -> None:
        self.cfg = cfg
        self.steps = Cadence(cfg)  # learned across attempts of the run
        self.run_has_steps = False
        self.run_has_output = False
        self._started = 0.0
        self._last_line_at: float | None = None
        self._last_line: str | None = None
        self._last_step_at: float | None = None
        self._last_step: int | None = None

    def start(self, now: float) -> None:
        self._started = now
        self._last_line_at = None
        self._last_line = None
        self._last_step_at = None
        self._last_step = None

    def activity(self, now: float) -> None:
        """Something other than a line shows the job at work (checkpoint files being written)."""
        if self._last_line_at is None or now > self._last_line_at:
            self._last_line_at = now

    def fired(self, silence: Silence) -> None:
        """A hang was declared: a learned timeout learns the silence (see the module doc)."""
        if silence.timeout_source == "learned":
            self.steps.add(silence.silent_s)

    def line(self, now: float, text: str) -> None:
        self._last_line_at = now
        self._last_line = text
        self.run_has_output = True

    def step(self, now: float, step: int | None) -> None:
        if self._last_step_at is not None:
            self.steps.add(now - self._last_step_at)  # pauses (eval, save) are intervals too
        self._last_step_at = now
        if step is not None:
            self._last_step = step
        self.run_has_steps = True
        if self._last_line_at is None or self._last_line_at < now:
            self._last_line_at = now

    @property
    def signal(self) -> str:
        """Which signal judges the job now: ``steps``, ``output`` or ``none``."""
        if self.run_has_steps:
            return "steps"
        if self.cfg.timeout_s is not None:
            return "output"
        return "none"

    def timeout(self) -> tuple[float, str]:
        if self.signal == "steps":
            return self.steps.timeout()
        if self.cfg.timeout_s is not None:
            return self.cfg.timeout_s, "config"
        return float("inf"), "off"

    def check(self, now: float) -> Silence | None:
        signal = self.signal
        if signal == "none":
            return None
        if signal == "steps" and self._last_step_at is None:
            # This attempt has not stepped yet: start-up (imports, load, compile) has its own
            # allowance; the step rhythm does not apply until the first step.
            since = now - self._started
            if since > self.cfg.startup_timeout_s:
                return Silence("startup", since, self.cfg.startup_timeout_s, "startup", None, self._last_line)
            return None
        if signal == "output" and self._last_line_at is None:
            since = now - self._started
            if self.run_has_output and since > self.cfg.startup_timeout_s:
                return Silence("startup", since, self.cfg.startup_timeout_s, "startup", None, None)
            return None
        assert self._last_line_at is not None
        silent = now - self._last_line_at
        limit, source = self.timeout()
        if silent > limit:
            return Silence(signal, silent, limit, source, self._last_step, self._last_line)
        return None

    def status(self, now: float) -> dict[str, object]:
        limit, source = self.timeout()
        return {
            "signal": self.signal,
            "timeout_s": None if limit == float("inf") else round(limit, 3),
            "timeout_source": source,
            "step_intervals_seen": self.steps.intervals,
            "last_step": self._last_step,
            "silent_s": None if self._last_line_at is None else round(max(0.0, now - self._last_line_at), 3),
        }
