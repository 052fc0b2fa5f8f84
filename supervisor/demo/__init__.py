"""The demo: a tiny character-level GPT on CPU that the supervisor watches, with injected faults.

The training job is ``supervisor/demo/train.py`` (run as ``python -m supervisor.demo.train``); its
corpus ``corpus.txt`` ships with the package. This module only builds the launch command, so the
daemon never imports torch: ``transformer-supervisor demo`` calls :func:`demo_job_argv` and
supervises the result like any other job.

Layout under the demo's ``out_dir`` (see :class:`DemoLayout`)::

    out_dir/checkpoints/step_000050.pt ...   # the job's checkpoints ([checkpoints].dir)
    out_dir/checkpoints/.demo_faults_fired   # which faults already fired (one-shot per run)
    out_dir/job_summary.json                 # final step, loss, val_loss (written at the end)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

#: optimizer steps of the default demo run (~35-50 s fault-free on one idle CPU core)
DEFAULT_STEPS = 600
DEFAULT_SEED = 0
#: the faults injected when none are chosen, each at a fraction of the run (faults.py's table)
DEFAULT_FAULTS: tuple[str, ...] = ("nan", "hang", "crash", "oom", "corrupt_ckpt")
#: every fault the job knows (``name`` or ``name@step``) and what it does (the job's --help)
FAULT_HELP: Mapping[str, str] = {
    "nan": "a weight becomes NaN at the step, so the loss printed at that step is nan",
    "hang": "at the step, stop heartbeating and printing and sleep forever (ignores the stop flag)",
    "crash": "raise RuntimeError during the step (exit 1 with a traceback)",
    "oom": "raise torch.OutOfMemoryError with CUDA's message during the step (exit 1)",
    "corrupt_ckpt": "after the first checkpoint at or after the step, truncate the newest "
    "checkpoint file to half its size, then crash",
    "bad_resume": "on the first resume at or after the step, train with the LR x100 for that attempt",
    "spike": "LR x50 for 30 steps from the step (a loss spike)",
}
KNOWN_FAULTS: tuple[str, ...] = tuple(FAULT_HELP)
CHECKPOINT_EVERY = 50
#: module run by the job's Python
JOB_MODULE = "supervisor.demo.train"
#: env var the job also reads its fault list from (``--faults`` wins)
FAULTS_ENV = "TSUP_DEMO_FAULTS"
#: beside the checkpoints: which faults already fired in this run
FAULTS_FIRED_FILE = ".demo_faults_fired"
#: the job resumes from TSUP_RESUME_FROM by itself; these args are equivalent, for configs that
#: prefer explicit resume args (``job.resume_args``)
RESUME_ARGS: tuple[str, ...] = ("--resume", "{checkpoint}")


@dataclass(frozen=True)
class DemoLayout:
    """Where the demo job writes, given the demo's output directory."""

    out_dir: Path

    @property
    def checkpoint_dir(self) -> Path:
        return self.out_dir / "checkpoints"

    @property
    def summary_file(self) -> Path:
        return self.out_dir / "job_summary.json"

    @property
    def faults_fired_file(self) -> Path:
        return self.checkpoint_dir / FAULTS_FIRED_FILE


def format_faults(faults: Sequence[str] | str | None) -> str:
    """``None`` -> the default set; ``[]`` or ``"none"`` -> ``"none"``; else a checked comma list."""
    if faults is None:
        items: list[str] = list(DEFAULT_FAULTS)
    elif isinstance(faults, str):
        items = [f.strip() for f in faults.split(",") if f.strip()]
    else:
        items = [f.strip() for f in faults if f.strip()]
    items = [f for f in items if f.lower() != "none"]
    for item in items:
        name, _, at = item.partition("@")
        if name not in KNOWN_FAULTS:
            raise ValueError(f"unknown demo fault {name!r}; known: {', '.join(KNOWN_FAULTS)}")
        if at and not at.isdigit():
            raise ValueError(f"demo fault {item!r}: the step after '@' must be a whole number")
    return ",".join(items) if items else "none"


def demo_job_argv(
    python: str,
    out_dir: str | Path,
    faults: Sequence[str] | str | None = None,
    seed: int = DEFAULT_SEED,
    steps: int = DEFAULT_STEPS,
    *,
    checkpoint_every: int = CHECKPOINT_EVERY,
    print_every: int = 10,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The exact launch command of the demo job.

    ``python``: the interpreter with torch (usually ``sys.executable``). ``out_dir``: the demo's
    output folder; checkpoints go to ``DemoLayout(out_dir).checkpoint_dir`` (point
    ``[checkpoints].dir`` there). ``faults``: names or ``name@step`` (``None``: the default set,
    ``[]``/``"none"``: a fault-free run). ``seed`` fixes init and data order; ``steps`` the length.
    The job picks up ``TSUP_RESUME_FROM``, ``TSUP_HEARTBEAT_DIR``, ``LR_SCALE`` and the client's
    skip-batches from its environment, so the command stays the same across restarts.
    """
    layout = DemoLayout(Path(out_dir))
    return [
        python, "-m", JOB_MODULE,
        "--steps", str(steps),
        "--seed", str(seed),
        "--faults", format_faults(faults),
        "--checkpoint-dir", str(layout.checkpoint_dir),
        "--checkpoint-every", str(checkpoint_every),
        "--print-every", str(print_every),
        "--summary-file", str(layout.summary_file),
        *extra_args,
    ]


__all__ = [
    "CHECKPOINT_EVERY", "DEFAULT_FAULTS", "DEFAULT_SEED", "DEFAULT_STEPS", "DemoLayout", "FAULT_HELP",
    "FAULTS_ENV", "FAULTS_FIRED_FILE", "JOB_MODULE", "KNOWN_FAULTS", "RESUME_ARGS", "demo_job_argv",
    "format_faults",
]
