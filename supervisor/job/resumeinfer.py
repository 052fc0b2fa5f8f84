"""How to hand a checkpoint to a job whose config does not say (no ``job.resume_args``).

Two trainers have a resume flag everyone uses, so it is inferred (explicit ``resume_args``
always win), from a script's source or a ``python -m`` module's alike:

- the HF Trainer: ``--resume_from_checkpoint {checkpoint}``. A script counts as an HF Trainer
  script when its argv has ``--output_dir`` (TrainingArguments' one required field) and its source
  mentions ``TrainingArguments``, ``HfArgumentParser``, ``Trainer(`` (or a TRL ``SFTConfig`` /
  ``SFTTrainer``): both, so a script that merely has an ``--output_dir`` flag is not handed a flag
  it would reject;
- nanoGPT: ``--init_from=resume``. Its configurator takes ``--key=value`` for any module-level
  name, and the script loads ``out_dir/ckpt.pt`` itself. Recognised by ``init_from = ...`` and
  ``out_dir = ...`` at module level.

Also here: whether a job reads ``TSUP_RESUME_FROM`` itself (the client library or the variable in
its source), which is the other way a checkpoint reaches it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from ..checkpoints.finddir import has_flag, read_source, script_of
from .modulesource import module_source, modules_of

_HF_MARKERS = re.compile(r"\b(TrainingArguments|HfArgumentParser|Seq2SeqTrainingArguments|SFTConfig|SFTTrainer)\b"
                         r"|\bTrainer\(")
_NANO_INIT = re.compile(r"^init_from\s*=", re.M)
_NANO_OUT = re.compile(r"^out_dir\s*=", re.M)
_CLIENT = re.compile(r"TSUP_RESUME_FROM|supervisor\.client|from supervisor import client")


@dataclass(frozen=True)
class InferredResume:
    """Resume args for a known trainer and, for people, why."""

    args: tuple[str, ...]
    trainer: str
    why: str


def _script(argv: Sequence[str], workdir: Path, env: Mapping[str, str] | None) -> tuple[Path | None, str]:
    """The job's script and its source: the first module of ``-m`` found as ``-m`` finds the job's
    own code (modulesource.py: a launcher such as ``torch.distributed.run`` is not the job's, and is
    passed over), else a ``*.py`` word; a module is a script for what is read here."""
    for module in modules_of(argv):
        p = module_source(module, workdir, env)
        if p is not None:
            return p, read_source(p)
    i = script_of(argv)
    if i is None:
        return None, ""
    p = Path(argv[i]).expanduser()
    p = p if p.is_absolute() else workdir / p
    return p, read_source(p)


def infer_resume(argv: Sequence[str], workdir: Path, env: Mapping[str, str] | None = None) -> InferredResume | None:
    """The resume args for ``argv``'s trainer when it is one whose flag is known, else None.
    ``env``: the job's environment (its PYTHONPATH, for a module); this process's when None."""
    script, src = _script(argv, workdir, env)
    if script is None or not src:
        return None
    if has_flag(argv, "--output_dir") and _HF_MARKERS.search(src):
        return InferredResume(("--resume_from_checkpoint", "{checkpoint}"), "hf",
                              f"inferred --resume_from_checkpoint for an HF Trainer script ({script.name}); "
                              "set job.resume_args to override")
    if _NANO_INIT.search(src) and _NANO_OUT.search(src):
        return InferredResume(("--init_from=resume",), "nanogpt",
                              f"inferred --init_from=resume for a nanoGPT-style script ({script.name}, which "
                              "resumes from out_dir/ckpt.pt itself); set job.resume_args to override")
    return None


def reads_resume_env(argv: Sequence[str], workdir: Path, env: Mapping[str, str] | None = None) -> bool:
    """The job's script reads TSUP_RESUME_FROM itself (directly or through supervisor.client)."""
    _, src = _script(argv, workdir, env)
    return bool(_CLIENT.search(src))
