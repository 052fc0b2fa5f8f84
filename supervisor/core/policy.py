"""The restart policy: one pure function from (run history, failure) to a decision.

No processes, no clock reads, no randomness of its own (the caller passes ``now`` and a jitter
draw), so every rule can be tested with scripted histories.

Rules, in order:
1. The action is ``[on.<cause>].action`` when configured, else the monitor's suggestion (a
   node-level Xid suggests ``give_up``), else the cause's default.
2. ``warn`` records and lets the job run; ``give_up`` gives up (what an action does is its
   ``ActionSpec``: these are ``ends_attempt`` and ``relaunches``); an action not ``counted`` skips
   rules 3, 3b and 4 (its relaunch is free, like an operator's restart).
3. No futile repeats: the same cause at the same step (within ``policy.repeat_step_tolerance``),
   resuming from the same checkpoint with the same command and environment as the attempt before
   (:class:`RepeatKey`) is deterministic: the second occurrence climbs the remedy ladder at once
   (no backoff) or, with no rung left, gives up naming the step, the checkpoint, the evidence and
   what a human should try. Not for causes that come from outside the job (hang, NCCL, GPU, a
   SIGKILL/SIGTERM), which say nothing about the next attempt.
3b. The remedy ladder: each consecutive repeat of the same cause climbs one rung (cumulative);
   when the cause repeats past the last rung, give up ("the remedies did not help").
4. The restart budget: at most ``max_restarts`` restarts whose failures fell inside the last
   ``restart_window_s``; one more gives up.
5. Delay before the relaunch (restart as soon as it is safe): none after an attempt that made
   progress (its steps went past the step it resumed from; the relaunch waits only for the old
   process tree to be gone), none for a rollback after a detected NaN or loss spike, none after a
   checkpoint load error (the next attempt resumes from another checkpoint); otherwise
   backoff ``initial * factor**(n-1)`` capped at ``max``, n = attempts in a row that failed without
   progress (an attempt that made progress or ran ``healthy_after_s`` resets the count);
   +/- ``jitter``. The decision says which rule set the delay (``delay_reason``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Sequence

from .causes import ACTIONS, CAUSES, Action, Cause
from .settings import Remedy, RunSettings, find_flag


@dataclass(frozen=True)
class RepeatKey:
    """What makes two failures the same: where the attempt started, what ran, where and how it failed."""

    checkpoint: str | None  # resumed from (None: from scratch)
    resume_step: int | None
    launch: str  # a digest of the argv and the env the supervisor chose (remedies, diagnostics)
    step: int | None  # where it failed (the onset when known)
    detail: str = ""  # e.g. "exit 1", "SIGSEGV"


#: Causes a second identical occurrence of which is taken as deterministic.
REPEATABLE = frozenset({Cause.NAN, Cause.LOSS_SPIKE, Cause.CRASH, Cause.OOM, Cause.VALIDATION_FAILED,
                        Cause.CHECKPOINT_LOAD_ERROR})
#: Crashes by these signals were sent from outside; the next attempt need not meet them.
EXTERNAL_SIGNALS = frozenset({"SIGKILL", "SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"})
#: The end of an exit's signal the supervisor itself sent (daemon/ckptsignal.py): not the job's crash.
BY_SUPERVISOR = " (sent by the supervisor)"

_TRY: Mapping[Cause, str] = MappingProxyType({
    Cause.NAN: "lower the learning rate (or add [on.nan] remedies that scale it), enable gradient clipping, "
               "or look at the data around that step",
    Cause.LOSS_SPIKE: "lower the learning rate or add [on.loss_spike] remedies (e.g. skip_batches), "
                      "or look at the data around that step",
    Cause.OOM: "lower the batch size or sequence length (or add [on.oom] remedies that do)",
    Cause.CRASH: "read the traceback at the end of job.log; the same code on the same state fails the same way",
    Cause.VALIDATION_FAILED: "compare the resumed checkpoint with the run before it, or roll back by hand "
                             "with `transformer-supervisor restart --from`",
    Cause.CHECKPOINT_LOAD_ERROR: "check that the checkpoint matches the model config, or resume from another "
                                 "with `transformer-supervisor restart --from`",
})


def same_failure(a: RepeatKey | None, b: RepeatKey | None, tolerance: int) -> bool:
    """``a`` and ``b`` are one deterministic failure (both known, same start, same launch, same place)."""
    if a is None or b is None:
        return False
    if (a.checkpoint, a.resume_step, a.launch, a.detail) != (b.checkpoint, b.resume_step, b.launch, b.detail):
        return False
    if a.step is None or b.step is None:
        return a.step is None and b.step is None
    return abs(a.step - b.step) <= tolerance


@dataclass(frozen=True)
class PastAttempt:
    """What the policy needs to know about an attempt that already ended."""

    attempt: int
    cause: Cause | None  # None: ended without a failure (daemon restart, operator stop)
    ended_at: float  # wall-clock seconds
    ran_s: float
    counted: bool = True  # False: not a failure (e.g. the daemon itself was restarted)
    progressed: bool = False  # its steps went past the step it resumed from
    repeat: RepeatKey | None = None  # what its failure looked like (None: unknown, e.g. recovered)


@dataclass(frozen=True)
class Failure:
    cause: Cause
    summary: str
    suggested_action: Action | None = None
    step: int | None = None
    onset_step: int | None = None
    detail: str = ""  # how it ended, for a crash: "exit 1", "SIGSEGV"


@dataclass(frozen=True)
class AppliedRemedies:
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    args: tuple[str, ...] = ()
    skip_batches: int = 0
    rungs: tuple[int, ...] = ()  # which rungs (0-based) are applied
    scale: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))  # flag -> product

    def as_json(self) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        if self.rungs:
            out.append({"rungs": list(self.rungs), "env": dict(self.env), "args": list(self.args),
                        "skip_batches": self.skip_batches, "scale": dict(self.scale)})
        return out


@dataclass(frozen=True)
class RemediesInForce:
    """What every following attempt gets from the ladders climbed so far, all causes together:
    one value from the machine to the launch and ``status`` (a decision's rungs are merged in
    with :meth:`plus`)."""

    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    args: tuple[str, ...] = ()
    skip_batches: int = 0
    scale: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))  # flag -> factor

    def plus(self, r: AppliedRemedies) -> RemediesInForce:
        """With ``r`` applied: env updated, args merged, the larger skip; a flag's factor is the
        ladder's cumulative product already, so it replaces the one before (not multiplied again)."""
        return RemediesInForce(MappingProxyType({**self.env, **r.env}), tuple(merge_args(self.args, r.args)),
                               max(self.skip_batches, r.skip_batches), MappingProxyType({**self.scale, **r.scale}))

    def as_status(self) -> dict[str, object]:
        return {"env": dict(self.env), "args": list(self.args), "skip_batches": self.skip_batches,
                "scale": dict(self.scale)}


@dataclass(frozen=True)
class Decision:
    action: Action
    cause: Cause
    reason: str  # why, in words, for the journal
    delay_s: float = 0.0
    restarts_in_window: int = 0  # counting this one when it restarts
    max_restarts: int = 0
    remedies: AppliedRemedies = field(default_factory=AppliedRemedies)
    delay_reason: str = ""  # which rule set delay_s, in words

    @property
    def relaunch(self) -> bool:
        return ACTIONS[self.action].relaunches


def combine_remedies(remedies: Sequence[Remedy], upto: int) -> AppliedRemedies:
    """Cumulative effect of rungs 0..upto-1: env merged, args appended or replacing, skip max."""
    env: dict[str, str] = {}
    args: list[str] = []
    skip = 0
    scale: dict[str, float] = {}
    for r in remedies[:upto]:
        env.update(r.env)
        args = merge_args(args, r.args)
        skip = max(skip, r.skip_batches)
        for flag, factor in r.scale.items():
            scale[flag] = scale.get(flag, 1.0) * factor
    return AppliedRemedies(MappingProxyType(env), tuple(args), skip, tuple(range(min(upto, len(remedies)))),
                           MappingProxyType(scale))


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def scaled_value(text: str, factor: float) -> str:
    """``text`` (a number) times ``factor``, written in the same kind: an int stays an int (>= 1 when it was),
    a float stays a float (``25.0``, ``0.0005``) so type-checking parsers (nanoGPT's configurator) accept it."""
    value = float(text)
    if "." not in text and "e" not in text.lower() and value == int(value):
        out = int(round(value * factor))
        return str(max(out, 1) if value >= 1 else out)
    return repr(value * factor)


def scale_args(argv: Sequence[str], scale: Mapping[str, float]) -> list[str]:
    """``argv`` with each named flag's value multiplied (a flag that is absent or not a number is left alone;
    config checks refuse that in advance)."""
    out = list(argv)
    for flag, factor in scale.items():
        hit = find_flag(out, flag)
        if hit is None or _number(hit[1]) is None:
            continue
        i, value = hit
        new = scaled_value(value, factor)
        out[i] = f"{flag}={new}" if out[i].startswith(flag + "=") else new
    return out


def _arg_key(arg: str) -> str | None:
    if arg.startswith("-") and "=" in arg:
        return arg.split("=", 1)[0]
    return None


def merge_args(base: Sequence[str], extra: Sequence[str]) -> list[str]:
    """Append ``extra`` to ``base``; an ``--key=value`` in extra replaces an earlier ``--key=...``."""
    out = list(base)
    for arg in extra:
        key = _arg_key(arg)
        if key is not None:
            for i, old in enumerate(out):
                if _arg_key(old) == key:
                    out[i] = arg
                    break
            else:
                out.append(arg)
        else:
            out.append(arg)
    return out


def _streak(history: Sequence[PastAttempt], cause: Cause, healthy_after_s: float) -> int:
    """How many attempts in a row (newest first) ended with ``cause`` without a healthy run."""
    n = 0
    for past in reversed(history):
        if not past.counted:
            continue
        if past.cause != cause or past.ran_s >= healthy_after_s:
            break
        n += 1
    return n


def _consecutive_failures(history: Sequence[PastAttempt], healthy_after_s: float) -> int:
    n = 0
    for past in reversed(history):
        if not past.counted:
            continue
        if past.cause is None or past.ran_s >= healthy_after_s or past.progressed:
            break
        n += 1
    return n


def relaunch_delay(cfg: RunSettings, history: Sequence[PastAttempt], cause: Cause, action: Action, *,
                   ran_s: float, progressed: bool, jitter_draw: float) -> tuple[float, str]:
    """(delay, why) before relaunching after ``cause``; rule 5 of the module docstring."""
    p = cfg.policy
    spec = CAUSES[cause]
    if ACTIONS[action].before_onset and spec.rollback_at_once:
        return 0.0, f"no delay: rollback after a detected {cause.value}"
    if spec.no_backoff:
        return 0.0, f"no delay: {spec.no_backoff}"
    if progressed:
        return 0.0, "no delay: the attempt made progress; relaunching once its process tree is gone"
    consecutive = (_consecutive_failures(history, p.healthy_after_s) + 1) if ran_s < p.healthy_after_s else 1
    delay = backoff_delay(cfg, consecutive, jitter_draw)
    if ran_s >= p.healthy_after_s:
        return delay, f"backoff {delay:.1f} s: the first failure after a healthy run (no step progress seen)"
    return delay, (f"backoff {delay:.1f} s: {consecutive} attempt(s) in a row failed without progress "
                   f"(policy.backoff_initial_s = {p.backoff_initial_s:g}, factor {p.backoff_factor:g})")


def backoff_delay(cfg: RunSettings, consecutive: int, jitter_draw: float) -> float:
    """Delay before the next launch; ``jitter_draw`` in [-1, 1] (the caller draws it)."""
    p = cfg.policy
    if consecutive <= 0 or p.backoff_initial_s <= 0:
        return 0.0
    base = min(p.backoff_max_s, p.backoff_initial_s * p.backoff_factor ** (consecutive - 1))
    return max(0.0, base * (1.0 + p.backoff_jitter * max(-1.0, min(1.0, jitter_draw))))


def decide(cfg: RunSettings, history: Sequence[PastAttempt], failure: Failure, *, now: float,
           ran_s: float, jitter_draw: float = 0.0, progressed: bool = False,
           repeat: RepeatKey | None = None) -> Decision:
    """Decide what to do about ``failure`` that ended (or must end) the current attempt.

    ``history`` holds the attempts that ended before the current one; ``ran_s`` is how long the
    current attempt ran; ``progressed``: its steps went past the step it resumed from; ``repeat``:
    what the current attempt's failure looks like, compared with the attempt before it.
    """
    cause = failure.cause
    p = cfg.policy
    if cfg.action_configured(cause) or failure.suggested_action is None:
        action = cfg.action_for(cause)
        why_action = (f"[on.{cause.value}] action = {action.value}" if cfg.action_configured(cause)
                      else f"the default for {cause.value}")
    else:
        action = failure.suggested_action
        why_action = f"the monitor's advice for this fault ({failure.summary})"

    if not ACTIONS[action].ends_attempt:
        return Decision(action, cause, f"recorded only ({why_action}); the job keeps running")
    if not ACTIONS[action].relaunches:
        return Decision(action, cause, f"{cause.value} needs a human ({why_action})")
    if not ACTIONS[action].counted:  # neither the ladder nor the budget: the backoff alone
        delay, delay_reason = relaunch_delay(cfg, history, cause, action, ran_s=ran_s, progressed=progressed,
                                             jitter_draw=jitter_draw)
        return Decision(action, cause, f"{action.value} ({why_action}); not counted against the restart budget",
                        delay_s=delay, max_restarts=p.max_restarts, delay_reason=delay_reason,
                        restarts_in_window=_in_window(history, now - p.restart_window_s))

    # The ladder: a repeat of the same cause (no healthy run between) climbs one rung.
    remedies = cfg.remedies_for(cause)
    repeats = _streak(history, cause, p.healthy_after_s) if ran_s < p.healthy_after_s else 0
    identical = _identical_repeat(history, cause, repeat, p.repeat_step_tolerance)
    if identical is not None and repeats > len(remedies):  # no new rung would change the next attempt
        return Decision(Action.GIVE_UP, cause, _futile_message(cfg, cause, failure, identical, repeat, remedies))
    if remedies and repeats > len(remedies):
        return Decision(Action.GIVE_UP, cause,
                        f"{cause.value} repeated after all {len(remedies)} remedies of [on.{cause.value}] "
                        f"were applied; the remedies did not help")
    applied = combine_remedies(remedies, repeats)

    in_window = _in_window(history, now - p.restart_window_s)
    if in_window + 1 > p.max_restarts:
        return Decision(Action.GIVE_UP, cause,
                        f"restart budget spent: {in_window} restarts in the last "
                        f"{p.restart_window_s:g} s (policy.max_restarts = {p.max_restarts})",
                        restarts_in_window=in_window, max_restarts=p.max_restarts, remedies=applied)

    delay, delay_reason = relaunch_delay(cfg, history, cause, action, ran_s=ran_s, progressed=progressed,
                                         jitter_draw=jitter_draw)
    if identical is not None and delay:
        delay, delay_reason = 0.0, ("no delay: an identical repeat is deterministic; waiting would not change it, "
                                    "the next remedy rung does")
    reason = f"{action.value} ({why_action})"
    if applied.rungs:
        reason += f"; remedies 1-{len(applied.rungs)} of [on.{cause.value}] applied"
    return Decision(action, cause, reason, delay_s=delay, restarts_in_window=in_window + 1,
                    max_restarts=p.max_restarts, remedies=applied, delay_reason=delay_reason)


def _in_window(history: Sequence[PastAttempt], window_start: float) -> int:
    """The counted restarts since ``window_start`` (rule 4)."""
    return sum(1 for a in history if a.counted and a.cause is not None and a.ended_at >= window_start)


def _identical_repeat(history: Sequence[PastAttempt], cause: Cause, repeat: RepeatKey | None,
                      tolerance: int) -> PastAttempt | None:
    """The attempt just before this one, when it failed identically (rule 3); else None."""
    if cause not in REPEATABLE or repeat is None:
        return None
    if cause is Cause.CRASH and (repeat.detail in EXTERNAL_SIGNALS or repeat.detail.endswith(BY_SUPERVISOR)):
        return None
    counted = [a for a in history if a.counted]
    if not counted:
        return None
    prev = counted[-1]
    if prev.cause is cause and same_failure(prev.repeat, repeat, tolerance):
        return prev
    return None


def _futile_message(cfg: RunSettings, cause: Cause, failure: Failure, prev: PastAttempt, repeat: RepeatKey | None,
                    remedies: Sequence[Remedy]) -> str:
    assert repeat is not None and prev.repeat is not None
    where = f"at step {repeat.step}" if repeat.step is not None else "before any step"
    first = f"step {prev.repeat.step}" if prev.repeat.step is not None else "no step"
    start = (f"resuming from {repeat.checkpoint} (step {repeat.resume_step})" if repeat.checkpoint
             else "starting from scratch (no checkpoint)")
    left = (f"all {len(remedies)} remedies of [on.{cause.value}] are applied" if remedies
            else f"no remedy is configured in [on.{cause.value}]")
    return (f"{cause.value} {where} again, identical to attempt {prev.attempt} ({first}): {start} with the same "
            f"command and environment, so the failure is deterministic and a third attempt would fail the same "
            f"way; {left}. Evidence: {failure.summary}"
            + (f" ({repeat.detail})" if repeat.detail else "")
            + f". Try: {_TRY.get(cause, 'look at job.log around that step')}")
