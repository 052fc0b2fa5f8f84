"""Config sections ``[heartbeat]`` and ``[detectors]`` (the watch concern).

Defaults are chosen for an unattended overnight run: nothing fires on a healthy, noisy loss
curve, a real divergence or NaN is caught within a few logged steps, and hang detection is
learned from the job's own rhythm unless a timeout is given.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from ..fieldmeta import meta


def check_metric_regex(p: str) -> str | None:
    """Why ``p`` cannot be a metric regex (``[detectors.parsers] regexes``, ``wrap --metric-regex``),
    or None."""
    try:
        rx = re.compile(p)
    except re.error as exc:
        return f"not a valid regular expression: {exc}"
    if not rx.groupindex:
        return ("has no named group; name what it captures, e.g. "
                "(?P<step>\\d+) and (?P<loss>[-+.\\w]+)")
    unknown = set(rx.groupindex) - _METRIC_GROUPS
    if "step" not in rx.groupindex and "loss" not in rx.groupindex and not unknown:
        return "captures neither step nor loss"
    return None


def _check_regexes(patterns: tuple[str, ...]) -> str | None:
    for i, p in enumerate(patterns):
        why = check_metric_regex(p)
        if why is not None:
            return f"[{i}] {p!r} {why}" if not why.startswith("not a valid") else f"[{i}] is {why}"
    return None


def _check_plain_regexes(patterns: tuple[str, ...]) -> str | None:
    for i, p in enumerate(patterns):
        try:
            re.compile(p)
        except re.error as exc:
            return f"[{i}] is not a valid regular expression: {exc}"
    return None


# Named groups a user regex may use; any other group name lands in MetricRecord.extra.
_METRIC_GROUPS = {"step", "loss", "grad_norm", "lr", "tokens_per_sec", "val_loss", "rank"}


@dataclass(frozen=True)
class HeartbeatConfig:
    """``[heartbeat]``: per-rank heartbeats from ``supervisor.client`` and hang detection."""

    timeout_s: float | None = field(default=None, metadata=meta(
        "a rank whose last heartbeat is older than this is hung; for a job without the client, one that "
        "prints no new step and no line for this long; unset: learned from the job's rhythm",
        min=0, min_exclusive=True))
    startup_timeout_s: float = field(default=1800.0, metadata=meta(
        "time from launch to every rank's first heartbeat (model load, compile, NCCL init)",
        min=0, min_exclusive=True))
    expect_heartbeats: bool = field(default=False, metadata=meta(
        "the job uses supervisor.client: apply startup_timeout_s from the first attempt "
        "(otherwise it applies once any attempt has sent a heartbeat)"))
    checkpoint_timeout_s: float = field(default=3600.0, metadata=meta(
        "allowance while a rank says it is checkpointing (client.checkpointing())",
        min=0, min_exclusive=True))
    initial_timeout_s: float = field(default=900.0, metadata=meta(
        "timeout used while a timeout is still being learned (timeout_s unset)",
        min=0, min_exclusive=True))
    learn_after: int = field(default=20, metadata=meta(
        "heartbeat intervals to observe before the learned timeout takes over", min=1))
    step_learn_after: int = field(default=3, metadata=meta(
        "intervals between new training steps (printed, or in the job's metric files) before the timeout "
        "learned from them takes over; from the first interval until then it is provisional, with twice "
        "the margin (a job that logs every 50 steps is judged on its own cadence, not after 1,000 steps)",
        min=1))
    learn_factor: float = field(default=5.0, metadata=meta(
        "learned timeout = longest observed interval x this factor", min=1))
    learn_floor_s: float = field(default=60.0, metadata=meta(
        "the learned timeout is never below this", min=0, min_exclusive=True))
    client_interval_s: float = field(default=1.0, metadata=meta(
        "the client writes a heartbeat at most this often (TSUP_HEARTBEAT_INTERVAL_S)",
        min=0))
    check_interval_s: float = field(default=0.25, metadata=meta(
        "how often the daemon reads the heartbeat files", min=0, min_exclusive=True))
    output_liveness: bool = field(default=True, metadata=meta(
        "a job without heartbeats that has printed parsed training steps is hung when it prints no new "
        "step and no line for timeout_s, else the timeout learned from its step rhythm (initial_timeout_s "
        "until the first step interval, or the first step far enough in to time it; then provisional, "
        "max(learn_floor_s, longest gap x learn_factor x 2), until step_learn_after intervals, then "
        "max(learn_floor_s, longest gap x learn_factor)); a job whose steps cannot be parsed is judged only "
        "with an explicit timeout_s"))
    output_stall_timeout_s: float | None = field(default=None, metadata=meta(
        "hang when the job prints no line at all for this long (for jobs without the client)",
        min=0, min_exclusive=True))
    progress_stall_timeout_s: float | None = field(default=None, metadata=meta(
        "hang when no new training step is logged for this long (for jobs without the client)",
        min=0, min_exclusive=True))
    dump_stacks: bool = field(default=True, metadata=meta(
        "before stopping a hung job, dump every process's Python stacks with py-spy into the state dir"))
    dump_stacks_native: bool = field(default=False, metadata=meta(
        "include native (C/C++/CUDA) frames in the py-spy dump (slower)"))
    dump_stacks_timeout_s: float = field(default=10.0, metadata=meta(
        "time limit for the py-spy dump of one process", min=0, min_exclusive=True))
    look_s: float = field(default=3.0, metadata=meta(
        "at the hang timeout, look before stopping: CPU time of the job's processes and py-spy stack samples "
        "across this window (every 0.5 s); stacks that move with CPU = busy (extended, hang_suspected), still "
        "stacks, no CPU or a stopped process = hung (within the timeout + this + about 1 s); 0: no look",
        min=0))
    max_busy_s: float = field(default=1800.0, metadata=meta(
        "a silent job judged busy is stopped as hung anyway once it has been silent this long past its "
        "timeout", min=0, min_exclusive=True))


def client_env(cfg: HeartbeatConfig) -> dict[str, str]:
    """Environment for the job: the client's write interval, kept well below the timeout (here,
    beside its config: the first launch needs it before the heartbeat monitor is imported)."""
    interval = cfg.client_interval_s
    if cfg.timeout_s is not None:
        interval = min(interval, cfg.timeout_s / 4)
    return {"TSUP_HEARTBEAT_INTERVAL_S": f"{interval:g}"}


@dataclass(frozen=True)
class ParsersConfig:
    """``[detectors.parsers]``: how log lines become metric records."""

    auto: bool = field(default=True, metadata=meta(
        "recognise JSON, HF Trainer, nanoGPT, torchtitan and Megatron-LM metric lines"))
    regexes: tuple[str, ...] = field(default=(), metadata=meta(
        "extra patterns with named groups step, loss, grad_norm, lr, tokens_per_sec, val_loss, rank "
        "(other names go to extra); tried per line after the built-in formats",
        check=_check_regexes))
    max_line_chars: int = field(default=4096, metadata=meta(
        "longer lines are not parsed for metrics (they are still scanned by the text detectors)",
        min=64))


@dataclass(frozen=True)
class NanDetectorConfig:
    """``[detectors.nan]``: a non-finite metric *value* (a parsed field, a metric file, the client).
    A word in prose is never one: a line that speaks of NaN is a warning (``nan_mentioned``), a NaN
    only in an eval metric too (``eval_nonfinite``), unless named here (``fields``, ``patterns``)."""

    enabled: bool = field(default=True, metadata=meta("detect NaN/Inf loss or grad norm"))
    consecutive: int = field(default=1, metadata=meta(
        "records with a non-finite loss (or other field) in a row before it fires", min=1))
    overflow_steps: int = field(default=20, metadata=meta(
        "records in a row whose grad norm is inf while their loss is finite (or nan beside a loss scale) "
        "before it fires: one such record is a step the fp16 loss scaler skipped (AMP's GradScaler, DeepSpeed, "
        "HF Trainer print it; a grad_overflow warning, never a stop), this many in a row is a run that no longer "
        "trains. Where the record prints a loss scale (loss_scale, \"loss scale\", scaler), a record at a lower scale "
        "than the one before starts the count over (the scaler at work: an fp16 warm-up from 2^32 skips ~32 steps); "
        "only records at a scale that no longer falls, or at its floor (1, or a printed min_loss_scale), count. "
        "A non-finite loss, and a nan grad norm with no loss scale beside it (HF's NaN filter hides "
        "the loss of a diverged run), fire at once (consecutive). 1: any non-finite grad norm rolls back", min=1))
    fields: tuple[str, ...] = field(default=("loss", "grad_norm"), metadata=meta(
        "which metric fields must stay finite: a non-finite value in one is a nan detection (Megatron's "
        '"number of nan iterations" above 0 too). A non-finite eval metric (val_loss, eval_loss, eval/..., '
        "validation/..., test_loss) while the training loss is finite is eval_nonfinite, a warning (notified "
        'by default), not a rollback; add "val_loss" here to roll back on a non-finite eval loss',
        check=lambda t: next((f"unknown field {x!r} (known: loss, grad_norm, val_loss)"
                              for x in t if x not in ("loss", "grad_norm", "val_loss")), None)))
    text: bool = field(default=True, metadata=meta(
        'warn (nan_mentioned, once per run, with the line) on a line that speaks of NaN/inf without a '
        'non-finite value in a metric field ("0 NaN detected", "Loss is NaN? False", AMP\'s "Detected inf in '
        'grads"); never a stop: a rollback needs a value'))
    patterns: tuple[str, ...] = field(default=(), metadata=meta(
        "regexes whose match on a line means NaN (a nan detection: rolled back); the only way a line of "
        "text stops a job", check=_check_plain_regexes))


@dataclass(frozen=True)
class LossSpikeConfig:
    """``[detectors.loss_spike]``: a persistent jump of the loss above its robust baseline.

    Baseline = median of the last ``window`` accepted losses; spread = 1.4826 x MAD (a robust
    sigma). A record is *high* when loss > median + max(z x sigma, min_rel x |median|). A spike is
    ``patience`` high records in a row; one outlier is not a spike. High records never enter the
    baseline, so a spike cannot hide itself by moving the median.
    """

    enabled: bool = field(default=True, metadata=meta("detect persistent loss spikes"))
    window: int = field(default=50, metadata=meta(
        "metric records in the rolling baseline (median and MAD)", min=5))
    min_points: int = field(default=20, metadata=meta(
        "records in the baseline before anything can be judged", min=3))
    warmup_steps: int = field(default=100, metadata=meta(
        "steps ignored at the start of every attempt (fresh or resumed)", min=0))
    z: float = field(default=6.0, metadata=meta(
        "robust z-score (in MAD sigmas) above the median that counts as high", min=0, min_exclusive=True))
    min_rel: float = field(default=0.2, metadata=meta(
        "and at least this fraction of the median above it (0.2 = 20 %)", min=0))
    patience: int = field(default=5, metadata=meta(
        "high records in a row that make a spike (counted in logged records, not steps)", min=1))


@dataclass(frozen=True)
class PrecursorConfig:
    """``[detectors.precursor]``: signs that a divergence is coming, acted on with a
    ``checkpoint-now`` request so that the rollback after the NaN lands close to its onset
    instead of a whole save interval back. Judged on the metrics already parsed, against the
    run's own recent distribution (median and 1.4826 x MAD over ``window`` records):
    the grad norm above ``grad_norm_z`` robust sigmas and ``grad_norm_factor`` x its median for
    ``patience`` records in a row; the AMP loss scale (``loss_scale``/``scale`` in the record)
    ``scale_drops`` halvings below its highest value within ``window`` records; the loss above ``loss_z`` sigmas for
    ``patience`` records in a row (below what the spike detector calls a spike). Each request is
    an event with its reason; at most one per ``min_interval_s``.
    """

    enabled: bool = field(default=True, metadata=meta(
        "ask the job for a checkpoint when the metrics show a divergence coming (needs the job to honour "
        "the checkpoint signal: the client, the HF/Lightning callbacks, or its own handler)"))
    window: int = field(default=100, metadata=meta("records in the rolling baseline", min=10))
    min_points: int = field(default=30, metadata=meta("records in the baseline before anything is judged", min=5))
    warmup_steps: int = field(default=100, metadata=meta(
        "steps ignored at the start of every attempt (fresh or resumed)", min=0))
    grad_norm_z: float = field(default=8.0, metadata=meta("robust z-score of a grad norm that counts as high",
                                                          min=0, min_exclusive=True))
    grad_norm_factor: float = field(default=3.0, metadata=meta(
        "and at least this many times the median grad norm", min=1))
    loss_z: float = field(default=4.0, metadata=meta("robust z-score of a loss that counts as rising",
                                                     min=0, min_exclusive=True))
    patience: int = field(default=3, metadata=meta("high records in a row that make a precursor", min=1))
    scale_drops: int = field(default=3, metadata=meta(
        "halvings of the loss scale below its highest value in the window that make a precursor", min=1))
    min_interval_s: float = field(default=300.0, metadata=meta(
        "seconds between two pre-emptive checkpoint requests", min=0))


@dataclass(frozen=True)
class TextDetectorConfig:
    """A detector that fires on log text (oom, nccl_timeout, checkpoint_load_error)."""

    enabled: bool = field(default=True, metadata=meta("detect this cause from log lines"))
    patterns: tuple[str, ...] = field(default=(), metadata=meta(
        "extra regexes whose match on a line means this cause", check=_check_plain_regexes))


@dataclass(frozen=True)
class DetectorsConfig:
    """``[detectors]``: log line parsing and the anomaly detectors fed by it."""

    evidence_chars: int = field(default=300, metadata=meta(
        "evidence lines are truncated to this many characters", min=40))
    blind_after_lines: int = field(default=200, metadata=meta(
        "metrics_blind (a warning, once per run, with sample lines and a ready-to-paste --metric-regex) when an "
        "attempt printed this many non-empty lines and no training step was parsed from them (0: off)", min=0))
    blind_after_s: float = field(default=120.0, metadata=meta(
        "or when the attempt has run this many seconds (from its start, whatever it printed, nothing at all "
        "included) without a training step or metric record from any source, whichever comes first (0: off)",
        min=0))
    metric_files: bool = field(default=True, metadata=meta(
        "find and follow the metric files the job writes under its working dir and output dirs: TensorBoard "
        "event files, metrics.csv (Lightning's CSVLogger), *.jsonl with a loss key; files older than the run "
        "are history"))
    metric_files_depth: int = field(default=4, metadata=meta(
        "directory levels searched below the working dir (and each output dir) for metric files", min=0, max=32))
    metric_files_max_dirs: int = field(default=2000, metadata=meta(
        "directories searched per pass (about once a second); past it the search stops and says so once",
        min=1))
    metric_files_poll_s: float = field(default=1.0, metadata=meta(
        "how often the metric files are searched for and read", min=0.05, max=60))
    parsers: ParsersConfig = field(default_factory=ParsersConfig)
    nan: NanDetectorConfig = field(default_factory=NanDetectorConfig)
    loss_spike: LossSpikeConfig = field(default_factory=LossSpikeConfig)
    precursor: PrecursorConfig = field(default_factory=PrecursorConfig)
    oom: TextDetectorConfig = field(default_factory=TextDetectorConfig)
    nccl_timeout: TextDetectorConfig = field(default_factory=TextDetectorConfig)
    checkpoint_load_error: TextDetectorConfig = field(default_factory=TextDetectorConfig)


__all__ = ["HeartbeatConfig", "DetectorsConfig", "ParsersConfig", "NanDetectorConfig",
           "LossSpikeConfig", "TextDetectorConfig"]
