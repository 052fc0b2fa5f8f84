"""Resume args inferred for trainers whose flag is known (HF Trainer, nanoGPT), and whether a
job reads TSUP_RESUME_FROM itself."""
from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.job.resumeinfer import infer_resume, reads_resume_env

JOBS = Path(__file__).resolve().parents[1] / "trainer_scripts"


@pytest.mark.parametrize("source", [
    "from transformers import Trainer, TrainingArguments\n",
    "from transformers import HfArgumentParser\n",
    "trainer = Trainer(model=m, args=a)\n",
    "from trl import SFTConfig, SFTTrainer\n",
])
@pytest.mark.parametrize("flag", [["--output_dir", "out"], ["--output_dir=out"]])
def test_an_hf_trainer_script_gets_resume_from_checkpoint(tmp_path: Path, source: str, flag: list[str]) -> None:
    (tmp_path / "train.py").write_text(source)
    inf = infer_resume(["torchrun", "--nproc-per-node=2", "train.py", *flag], tmp_path)
    assert inf is not None and inf.trainer == "hf"
    assert inf.args == ("--resume_from_checkpoint", "{checkpoint}")
    assert "HF Trainer" in inf.why and "job.resume_args" in inf.why


def test_both_the_flag_and_the_source_are_needed_for_hf(tmp_path: Path) -> None:
    (tmp_path / "hf.py").write_text("from transformers import TrainingArguments\n")
    (tmp_path / "plain.py").write_text("import argparse\np = argparse.ArgumentParser()\np.add_argument('--output_dir')\n")
    assert infer_resume(["python", "hf.py", "--save_dir", "out"], tmp_path) is None
    assert infer_resume(["python", "plain.py", "--output_dir", "out"], tmp_path) is None
    assert infer_resume(["python", "absent.py", "--output_dir", "out"], tmp_path) is None
    assert infer_resume(["python", "-m", "pkg.train", "--output_dir", "out"], tmp_path) is None


def test_a_nanogpt_style_script_gets_init_from_resume(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("out_dir = 'out'\ninit_from = 'scratch' # or 'resume'\n")
    inf = infer_resume(["python", "train.py", "--max_iters=100"], tmp_path)
    assert inf is not None and inf.trainer == "nanogpt" and inf.args == ("--init_from=resume",)
    (tmp_path / "other.py").write_text("def f(init_from='x'):\n    out_dir = 'o'\n")  # not module level
    assert infer_resume(["python", "other.py"], tmp_path) is None


def test_the_repositorys_trainer_jobs() -> None:
    hf = infer_resume(["python", str(JOBS / "hf_train.py"), "--output_dir", "out"], JOBS)
    nano = infer_resume(["python", str(JOBS / "nanogpt_train.py"), "--out_dir=out"], JOBS)
    assert hf is not None and hf.trainer == "hf"
    assert nano is not None and nano.trainer == "nanogpt"
    assert infer_resume(["python", str(JOBS / "lightning_train.py")], JOBS) is None


def test_a_job_that_reads_tsup_resume_from_itself(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("import os\nckpt = os.environ.get('TSUP_RESUME_FROM')\n")
    (tmp_path / "b.py").write_text("from supervisor.client import resume_info\n")
    (tmp_path / "c.py").write_text("print('hello')\n")
    assert reads_resume_env(["python", "a.py"], tmp_path)
    assert reads_resume_env(["python", "b.py"], tmp_path)
    assert not reads_resume_env(["python", "c.py"], tmp_path)
    assert reads_resume_env(["python", str(JOBS / "cb_hf_train.py")], JOBS)
