"""`python -m pkg.module` jobs get their resume flag inferred from the module's source, as a
script's is (issue 35 part 7): the module is found as `-m` finds the job's own code (the working
dir, then PYTHONPATH), never imported."""
from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.job.modulesource import module_source, modules_of
from supervisor.job.resumeinfer import infer_resume, reads_resume_env

HF = "from transformers import HfArgumentParser, Trainer, TrainingArguments\n"


@pytest.mark.parametrize("argv,modules", [
    (["python", "-m", "pkg.train", "--output_dir", "o"], ["pkg.train"]),
    (["python3.11", "-u", "-m", "pkg.train"], ["pkg.train"]),
    (["python", "-mpkg.train"], ["pkg.train"]),
    (["torchrun", "--nproc-per-node=2", "-m", "pkg.train", "--x", "a.py"], ["pkg.train"]),
    (["torchrun", "--module", "pkg"], ["pkg"]),
    (["python", "-m", "torch.distributed.run", "-m", "pkg.train"], ["torch.distributed.run", "pkg.train"]),
    (["python", "train.py", "-m", "pkg.train"], []),  # the script's own -m flag
    (["python", "-m", "not a module"], []),
    (["python", "-c", "print(1)"], []),
])
def test_the_modules_of_a_command(argv: list[str], modules: list[str]) -> None:
    assert modules_of(argv) == modules


def test_a_module_is_found_in_the_workdir_then_pythonpath_and_a_package_runs_its_main(tmp_path: Path) -> None:
    work, lib = tmp_path / "work", tmp_path / "lib"
    (work / "pkg").mkdir(parents=True)
    (work / "pkg" / "__init__.py").write_text("raise SystemExit('imported!')\n")  # never run
    (work / "pkg" / "train.py").write_text(HF)
    (lib / "other").mkdir(parents=True)
    (lib / "other" / "__main__.py").write_text(HF)
    assert module_source("pkg.train", work, {}) == work / "pkg" / "train.py"
    assert module_source("other", work, {}) is None
    assert module_source("other", work, {"PYTHONPATH": str(lib)}) == lib / "other" / "__main__.py"
    assert module_source("other", work, {"PYTHONPATH": "../lib"}) == work / "../lib" / "other" / "__main__.py"


def test_an_hf_trainer_module_gets_resume_from_checkpoint_like_a_script(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text(HF)
    inf = infer_resume(["python", "-m", "pkg.train", "--output_dir", "out"], tmp_path, {})
    assert inf is not None and inf.trainer == "hf" and inf.args == ("--resume_from_checkpoint", "{checkpoint}")
    assert "train.py" in inf.why
    (tmp_path / "pkg" / "envjob.py").write_text("import os\nckpt = os.environ.get('TSUP_RESUME_FROM')\n")
    assert reads_resume_env(["python", "-m", "pkg.envjob"], tmp_path, {})
    assert infer_resume(["python", "-m", "pkg.envjob", "--output_dir", "out"], tmp_path, {}) is None


def test_a_launcher_module_is_passed_over_for_the_job_it_launches(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(HF)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text(HF)
    for argv in (["python", "-m", "torch.distributed.run", "--nproc-per-node=2", "train.py", "--output_dir", "o"],
                 ["python", "-m", "torch.distributed.run", "-m", "pkg.train", "--output_dir", "o"]):
        inf = infer_resume(argv, tmp_path, {})
        assert inf is not None and inf.trainer == "hf", argv
