"""Did the job resume from the checkpoint it was handed? The rule for ``resume_ignored``.

After a resume from step S, the first training step the job reports is judged once. A job that
really loaded the checkpoint reports S+1 (or S, or its next logging step S+N); one that ignored it
(no resume flag, a wrong one, a script that never reads it) starts again near 0. The rule:

    ignored  <=>  first_step < S / 2   and   S - first_step >= MIN_GAP

The half keeps a job that logs every N steps, or counts from S+1, well clear of it; the minimum
gap keeps a resume from a very early checkpoint (step 4, first log at step 1 of a job that counts
epochs-local steps) from being called ignored on noise. Pure: the caller feeds the first step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MIN_GAP = 5
CHECK_NAME = "resume"  # the validation check that carries it (supervisor.core.validation)
RULE = f"first step >= resume step / 2, or less than {MIN_GAP} steps below it"


@dataclass(frozen=True)
class ResumeIgnored:
    resume_step: int
    first_step: int
    checkpoint: str | None = None

    @property
    def message(self) -> str:
        where = f" ({self.checkpoint})" if self.checkpoint else ""
        return (f"the job was resumed from step {self.resume_step}{where} but its first step was "
                f"{self.first_step}: it ignored the checkpoint and started over")

    def to_json(self) -> dict[str, Any]:
        return {"resume_step": self.resume_step, "first_step": self.first_step, "checkpoint": self.checkpoint,
                "rule": RULE}


def resume_ignored(resume_step: int | None, first_step: int | None,
                   checkpoint: str | None = None) -> ResumeIgnored | None:
    """``ResumeIgnored`` when ``first_step`` (the first step after a resume from ``resume_step``)
    is far below it, by the rule above; None when it is fine or either step is unknown."""
    if resume_step is None or first_step is None:
        return None
    if first_step < resume_step / 2 and resume_step - first_step >= MIN_GAP:
        return ResumeIgnored(resume_step, first_step, checkpoint)
    return None


def handover(resume: Any, flagged: bool) -> tuple[str | None, str]:
    """How a launch hands ``resume`` (core.messages.Resume) to the job, and the clause that says
    so: ``"flag"`` (the resume args carry it, configured or inferred), ``"env"`` (TSUP_RESUME_FROM,
    which the job reads), ``"none"`` (only in TSUP_RESUME_FROM, and nothing says the job reads it:
    no message may then say "resuming"), None (a fresh start)."""
    if not resume.checkpoint:
        return None, "fresh start (no checkpoint)"
    if flagged or resume.handed:
        return ("flag" if flagged else "env"), f"resuming from {resume.checkpoint} (step {resume.step})"
    return "none", (f"checkpoint {resume.checkpoint} (step {resume.step}) is in TSUP_RESUME_FROM only: no resume flag "
                    "is known for this job and it does not seem to read that variable, so it starts from scratch "
                    "unless it does (set --resume-arg / job.resume_args)")
