"""Is the job alive? Learned timeouts, and liveness from the job's own output.

Two pure pieces, driven by the heartbeat monitor with the main loop's monotonic clock:

:class:`Cadence` learns a timeout from observed intervals, as NVIDIA's resiliency extension
does: ``initial_timeout_s`` until ``learn_after`` intervals were seen, then ``max(learn_floor_s,
longest interval x learn_factor)``; a configured ``timeout_s`` overrides both. What was learned
carries over to later attempts of the run. Client heartbeats and printed steps each have one.

The step rhythm is judged on the job's own cadence, however sparse: a job that logs every N steps
(Lightning's 50 at its defaults: 1,000 steps for 20 intervals) would otherwise hold the 15 min
initial timeout for most of a short run. So the steps' cadence is *learned* after
``step_learn_after`` intervals (3), and before that it is *provisional*, with twice the margin:
``max(learn_floor_s, longest interval x learn_factor x 2)`` from the first interval on; before the
first interval, the first logged step itself says how long the job took to get there: when it is at
least :data:`FIRST_STEP_MIN` steps past the attempt's start, ``max(learn_floor_s, that time x
learn_factor x 2)``, never above ``initial_timeout_s`` (that time is counted from the job's last
start-up line before it, else from the launch, so it holds the data loading and compile too: it
is longer than the steps' own rhythm, never shorter). A file read in bursts (a TensorBoard writer
flushing every 2 min) adds the longest delay seen between a step's writing and its reading.
Where each timeout comes from is said in ``status`` (``timeout_from``).

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
  after the restart instead of looping. A pause longer than a provisional or learned timeout
  that is neither (a silent evaluation) is looked at before anything is stopped: a job at work is
  busy (:mod:`.hanggate`), extended and recorded as ``hang_suspected``, and its next step teaches
  the pause. Before the attempt's first
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

# The first logged step of an attempt says how long the job took to get there only when it is this
# many steps past the attempt's start: a step 0 or 1 printed at once (nanoGPT's iter 0, torchtitan's
# step 1) says nothing about a log every 100 steps.
FIRST_STEP_MIN = 10
PROVISIONAL_MARGIN = 2.0  # the provisional timeout's margin, on top of learn_factor


class Cadence:
    """A timeout learned from the intervals of one signal (heartbeats, or printed steps).

    ``learn_after``: intervals before the timeout is learned (default: the config's); with
    ``provisional`` the timeout is learned from the first interval on, with
    :data:`PROVISIONAL_MARGIN` times the margin until then."""

    def __init__(self, cfg: HeartbeatConfig, *, learn_after: int | None = None, provisional: bool = False) -> None:
        self.cfg = cfg
        self.learn_after = cfg.learn_after if learn_after is None else learn_after
        self.provisional = provisional
        self.intervals = 0
        self.max_interval = 0.0
        self.origin = ""  # where the last interval was seen ("output stdout", "metric file ...")

    def add(self, interval: float, origin: str = "") -> None:
        if interval > 0:
            self.intervals += 1
            self.max_interval = max(self.max_interval, interval)
            if origin:
                self.origin = origin

    @property
    def learned(self) -> bool:
        return self.intervals >= self.learn_after

    def timeout(self) -> tuple[float, str]:
        """The timeout in force and where it comes from: ``config``, ``learned`` or ``initial``."""
        if self.cfg.timeout_s is not None:
            return self.cfg.timeout_s, "config"
        if self.learned or (self.provisional and self.intervals):
            margin = 1.0 if self.learned else PROVISIONAL_MARGIN
            return max(self.cfg.learn_floor_s, self.max_interval * self.cfg.learn_factor * margin), "learned"
        return self.cfg.initial_timeout_s, "initial"

    def basis(self) -> str:
        """Where :meth:`timeout` comes from, for people (``status``)."""
        if self.cfg.timeout_s is not None:
            return "configured ([heartbeat] timeout_s)"
        if not self.intervals or not (self.learned or self.provisional):
            return (f"initial ([heartbeat] initial_timeout_s, until {self.learn_after} intervals are seen; "
                    f"{self.intervals} so far)")
        n = f"{self.intervals} interval{'s' if self.intervals != 1 else ''}"
        of = f" of the {self.origin}" if self.origin else ""
        until = "" if self.learned else f" (twice the margin until {self.learn_after} intervals)"
        return f"{'learned' if self.learned else 'provisional'} from {n}{of}, longest {self.max_interval:.1f} s{until}"


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
        self.steps = Cadence(cfg, learn_after=cfg.step_learn_after, provisional=True)  # across attempts
        self.run_has_steps = False
        self.run_has_output = False
        self.first: tuple[float, int, str] | None = None  # (seconds to the first step, step, origin): see the module doc
        self.max_lag = 0.0  # the longest delay from a step's writing to its reading (files read in bursts)
        self._started = 0.0
        self._start_step = 0
        self._last_line_at: float | None = None
        self._prev_line_at: float | None = None  # the batch of lines before the last one (the first step's timing)
        self._last_line: str | None = None
        self._last_step_at: float | None = None
        self._last_step: int | None = None

    def start(self, now: float, start_step: int | None = None) -> None:
        self._started = now
        self._start_step = start_step or 0
        self._last_line_at = self._prev_line_at = None
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
        if self._last_line_at is not None and now > self._last_line_at:
            self._prev_line_at = self._last_line_at
        self._last_line_at = now
        self._last_line = text
        self.run_has_output = True

    def step(self, now: float, step: int | None, origin: str = "", lag: float = 0.0) -> None:
        """A new step at ``now``, seen in ``origin``; ``lag``: how long after its writing it was read."""
        if self._last_step_at is not None:
            self.steps.add(now - self._last_step_at, origin)  # pauses (eval, save) are intervals too
            # Not the attempt's first: a file found late holds steps from long before it was read.
            self.max_lag = max(self.max_lag, min(lag, self.cfg.initial_timeout_s))
        elif step is not None and step - self._start_step >= FIRST_STEP_MIN:
            # The attempt's first step, far enough in to time the steps before it: from the last
            # start-up line before it (not the step's own line, read in the same batch; not a line
            # read after it, when the step comes late from a file), else from the launch.
            since = max((t for t in (self._last_line_at, self._prev_line_at) if t is not None and t < now),
                        default=self._started)
            self.first = (now - max(since, self._started), step, origin)
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
            value, source = self.steps.timeout()
            if source == "initial" and self.first is not None:
                cfg = self.cfg
                value = min(cfg.initial_timeout_s, max(cfg.learn_floor_s,
                                                       self.first[0] * cfg.learn_factor * PROVISIONAL_MARGIN))
                source = "learned"
            return (value + self.max_lag if source == "learned" else value), source
        if self.cfg.timeout_s is not None:
            return self.cfg.timeout_s, "config"
        return float("inf"), "off"

    def basis(self) -> str:
        """Where :meth:`timeout` comes from, for people (``status``: ``timeout_from``)."""
        signal = self.signal
        if signal == "none":
            return "off: no step parsed and no [heartbeat] timeout_s (see output_liveness_off)"
        if signal == "output" or self.cfg.timeout_s is not None:
            return "configured ([heartbeat] timeout_s)"
        if self.steps.intervals or self.first is None:
            text = self.steps.basis()
        else:
            seconds, step, origin = self.first
            text = (f"provisional from the first step ({step}, {seconds:.1f} s after the start-up"
                    f"{' in the ' + origin if origin else ''}), until a step interval is seen")
        return text + (f"; + {self.max_lag:.1f} s the files are read late" if self.max_lag >= 1.0 else "")

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
        basis = self.basis()
        if self.signal == "steps" and self._last_step_at is None:  # check(): the start-up allowance holds
            limit, source = self.cfg.startup_timeout_s, "startup"
            basis = f"start-up ([heartbeat] startup_timeout_s) until this attempt's first step; then {basis}"
        return {
            "signal": self.signal,
            "timeout_s": None if limit == float("inf") else round(limit, 3),
            "timeout_source": source,
            "timeout_from": basis,
            "step_intervals_seen": self.steps.intervals,
            "last_step": self._last_step,
            "silent_s": None if self._last_line_at is None else round(max(0.0, now - self._last_line_at), 3),
        }
