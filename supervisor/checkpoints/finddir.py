"""Where a job keeps its checkpoints when the config does not say: read from its command.

Trainers take their output folder as a flag (HF ``--output_dir``, nanoGPT ``--out_dir=``, many
scripts ``--save_dir`` / ``--ckpt_dir`` / ``--checkpoint_dir``), or, for nanoGPT, from the
``out_dir = '...'`` default at the top of its script or of a config file passed to it. Lightning's
``default_root_dir=`` is not the checkpoint folder itself (that is
``<root>/lightning_logs/version_N/checkpoints``), so it is returned as a root for the scan of
:mod:`supervisor.checkpoints.appearing` instead.

Pure apart from reading the job's script with a size cap (no import, no exec): the flag spellings
and the rule are in one place, and the unit tests feed argv shapes to it.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

# The flags that name a checkpoint/output folder, in the order they win when several are given
# (an explicit checkpoint folder beats a general output folder).
DIR_FLAGS: tuple[str, ...] = ("--checkpoint_dir", "--checkpoint-dir", "--ckpt_dir", "--ckpt-dir", "--save_dir",
                              "--save-dir", "--output_dir", "--output-dir", "--out_dir", "--out-dir")
ROOT_KEY = "default_root_dir"
SOURCE_CAP = 256 * 1024  # bytes read of a script: enough for any train.py, bounded for a huge generated one
# nanoGPT's configurator: a module-level ``out_dir = 'out'`` the command line may override.
_OUT_DIR_ASSIGN = re.compile(r"""^out_dir\s*=\s*['"]([^'"\n]+)['"]""", re.M)
_ROOT_ARG = re.compile(r"^(?:--)?(?:[\w-]+\.)*default_root_dir=(.+)$")
_LAUNCHERS = ("torchrun", "accelerate", "deepspeed", "python", "python3")


@dataclass(frozen=True)
class FoundDir:
    """A checkpoint folder (``root`` False) or a folder to scan for one (``root`` True), and how
    it was found, for the console and ``status``."""

    path: Path
    found_by: str
    root: bool = False


def command_argv(command: Sequence[str], shell: bool) -> list[str]:
    """The job's argv as words (a ``shell = true`` command is one string)."""
    if shell and command:
        try:
            return shlex.split(command[0])
        except ValueError:
            return command[0].split()
    return list(command)


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value of ``flag`` in ``--flag value`` or ``--flag=value`` form (the last one given
    wins, as with argparse); None when absent. ``--output_dir_suffix`` is not ``--output_dir``."""
    value: str | None = None
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            value = argv[i + 1]
        elif a.startswith(flag + "="):
            value = a[len(flag) + 1:]
    return value or None


def has_flag(argv: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def script_of(argv: Sequence[str]) -> int | None:
    """Index of the training script in ``argv``: the first ``*.py`` word (after ``python``,
    ``torchrun ...``, ``accelerate launch ...``, ``deepspeed ...``), or None."""
    for i, a in enumerate(argv):
        if a.endswith(".py") and not a.startswith("-") and "=" not in a:
            return i
    return None


def read_source(path: Path, cap: int = SOURCE_CAP) -> str:
    """The first ``cap`` bytes of a text file, '' when unreadable (never raises)."""
    try:
        with open(path, "rb") as f:
            return f.read(cap).decode("utf-8", "replace")
    except OSError:
        return ""


def _resolve(value: str, workdir: Path) -> Path:
    try:
        p = Path(value).expanduser()
    except RuntimeError:  # ~user of an unknown user: taken as written
        p = Path(value)
    return p if p.is_absolute() else workdir / p


def dir_from_command(argv: Sequence[str], workdir: Path) -> FoundDir | None:
    """The checkpoint folder the command names, or a root to scan (Lightning), or None."""
    for flag in DIR_FLAGS:
        v = flag_value(argv, flag)
        if v is not None:
            return FoundDir(_resolve(v, workdir), f"{flag} in the command")
    for i, a in enumerate(argv):
        m = _ROOT_ARG.match(a)
        if m is None and a.lstrip("-").split(".")[-1] == ROOT_KEY and i + 1 < len(argv):
            value = argv[i + 1]  # LightningCLI's --trainer.default_root_dir logs
        elif m is not None:
            value = m.group(1)
        else:
            continue
        return FoundDir(_resolve(value.strip("'\""), workdir), f"{ROOT_KEY}= in the command", root=True)
    return _nanogpt_default(argv, workdir)


def _nanogpt_default(argv: Sequence[str], workdir: Path) -> FoundDir | None:
    """nanoGPT: ``out_dir = '...'`` in a config file passed to the script (the last one wins, as
    its configurator execs them in order), else in the script itself."""
    i = script_of(argv)
    if i is None:
        return None
    found: FoundDir | None = None
    script = _resolve(argv[i], workdir)
    src = read_source(script)
    if "init_from" not in src:  # nanoGPT's resume switch: other scripts' out_dir is not a checkpoint dir
        return None
    if m := _OUT_DIR_ASSIGN.search(src):
        found = FoundDir(_resolve(m.group(1), workdir), f"out_dir = '{m.group(1)}' in {script.name}")
    for a in argv[i + 1:]:
        if a.endswith(".py") and not a.startswith("-") and "=" not in a:
            if m := _OUT_DIR_ASSIGN.search(read_source(_resolve(a, workdir))):
                found = FoundDir(_resolve(m.group(1), workdir), f"out_dir = '{m.group(1)}' in {a}")
    return found
