"""Resume flags for modules and scripts alike (issue 35 part 7), through the real daemon: the HF
Trainer script of tests/trainer_scripts, unmodified, in a tiny package run as `python -m
hfpkg.train` with no --checkpoint-dir and no --resume-arg. Its resume flag is inferred from the
module's source (found as `-m` finds it: the job's working dir), so after a crash it resumes from
its newest checkpoint, and every message about the hand-over says what happened."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import history
from tests.e2e.test_discovery_e2e import bare_wrap, in_work
from tests.e2e.test_trainers_e2e import JOBS, events, supervise  # noqa: F401 (the fixture)

PY = sys.executable


@pytest.mark.slow
def test_a_python_m_hf_trainer_module_resumes_from_its_newest_checkpoint_with_no_flag(supervise,
                                                                                      tmp_path: Path) -> None:
    work, out, sd = tmp_path / "work", tmp_path / "out", tmp_path / "sd"
    pkg = work / "hfpkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    shutil.copy(JOBS / "hf_train.py", pkg / "train.py")
    shutil.copy(JOBS / "_faults.py", pkg / "_faults.py")  # the script imports it from its own folder
    d = supervise(bare_wrap(tmp_path, in_work(tmp_path))
                  + [PY, "-m", "hfpkg.train", "--output_dir", str(out), "--max_steps", "12", "--save_steps", "5",
                     "--logging_steps", "1"], fault="crash@8")
    assert d.wait(300) == 0, d.stderr()[-3000:]
    [inferred] = events(d, "resume_inferred")
    assert "--resume_from_checkpoint" in inferred["message"] and "train.py" in inferred["message"], inferred
    a = history(sd)["attempts"]
    assert len(a) == 2 and a[0]["cause"] == "crash" and a[1]["exit_code"] == 0, a
    assert a[1]["checkpoint"] == str(out / "checkpoint-5") and a[1]["resume_step"] == 5, a[1]
    assert a[1]["argv"][-2:] == ["--resume_from_checkpoint", str(out / "checkpoint-5")]  # the hand-over itself
    [_, relaunch] = events(d, "job_started")
    assert relaunch["handed"] == "flag" and f"resuming from {out / 'checkpoint-5'} (step 5)" in relaunch["message"]
    assert not events(d, "resume_unavailable") and not events(d, "resume_ignored")
    assert a[1]["validation"] and a[1]["validation"]["verdict"] == "pass", a[1]["validation"]
