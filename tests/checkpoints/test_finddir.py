"""The checkpoint dir read from a job's command: every flag spelling, both forms, relative and
absolute, nanoGPT's defaults, Lightning's root, and the look-alikes that are not it."""
from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.checkpoints.finddir import DIR_FLAGS, command_argv, dir_from_command, flag_value

W = Path("/srv/train")


@pytest.mark.parametrize("flag", DIR_FLAGS)
@pytest.mark.parametrize("form", ["space", "equals"])
def test_each_flag_in_both_forms_relative_to_the_workdir(flag: str, form: str) -> None:
    args = [flag, "runs/a"] if form == "space" else [f"{flag}=runs/a"]
    found = dir_from_command(["python", "train.py", *args, "--lr", "0.1"], W)
    assert found is not None and not found.root
    assert found.path == W / "runs/a" and found.found_by == f"{flag} in the command"


@pytest.mark.parametrize("argv", [
    ["torchrun", "--nproc-per-node=8", "train.py", "--output_dir", "/abs/out"],
    ["accelerate", "launch", "--num_processes", "2", "train.py", "--output_dir=/abs/out"],
    ["deepspeed", "train.py", "--deepspeed", "ds.json", "--output_dir", "/abs/out"],
    ["python", "-u", "train.py", "--out_dir=/abs/out"],
])
def test_launchers_and_absolute_paths(argv: list[str]) -> None:
    found = dir_from_command(argv, W)
    assert found is not None and found.path == Path("/abs/out")


@pytest.mark.parametrize("argv", [
    ["python", "train.py", "--output_dir_suffix", "x"],
    ["python", "train.py", "--output_dir_suffix=x"],
    ["python", "train.py", "--my-output-dir", "x"],
    ["python", "train.py", "--logging_dir", "logs"],
    ["python", "train.py", "--output_dir"],  # no value
    ["python", "train.py", "--output_dir", "--lr", "1"],  # the next word is a flag, not a value
    ["python", "train.py", "--save_steps", "100", "--save_total_limit=3"],
    [],
])
def test_look_alikes_are_not_a_checkpoint_dir(argv: list[str]) -> None:
    assert dir_from_command(argv, W) is None


def test_a_checkpoint_dir_flag_beats_an_output_dir_and_the_last_one_given_wins() -> None:
    found = dir_from_command(["python", "t.py", "--output_dir", "out", "--save_dir", "s1", "--save_dir=s2"], W)
    assert found is not None and found.path == W / "s2" and found.found_by == "--save_dir in the command"
    assert flag_value(["--out_dir=a", "--out_dir", "b"], "--out_dir") == "b"


@pytest.mark.parametrize("arg", [["--trainer.default_root_dir=logs"], ["--trainer.default_root_dir", "logs"],
                                 ["trainer.default_root_dir=logs"], ["default_root_dir=logs"]])
def test_lightnings_default_root_dir_is_a_root_to_scan_not_the_dir(arg: list[str]) -> None:
    found = dir_from_command(["python", "fit.py", *arg], W)
    assert found is not None and found.root and found.path == W / "logs"
    assert "default_root_dir" in found.found_by


def test_a_shell_command_is_split_into_words() -> None:
    argv = command_argv(["cd /x && python train.py --output_dir 'my out'"], shell=True)
    found = dir_from_command(argv, W)
    assert found is not None and found.path == W / "my out"


def test_nanogpt_out_dir_default_from_its_script_then_its_config_file(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("init_from = 'scratch'\nout_dir = 'out'\nexec(open('configurator.py').read())\n")
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "shakespeare.py").write_text("out_dir = 'out-shakespeare'\n")
    found = dir_from_command(["python", "train.py"], tmp_path)
    assert found is not None and found.path == tmp_path / "out" and "train.py" in found.found_by
    found = dir_from_command(["python", "train.py", "config/shakespeare.py"], tmp_path)
    assert found is not None and found.path == tmp_path / "out-shakespeare"
    found = dir_from_command(["python", "train.py", "config/shakespeare.py", "--out_dir=elsewhere"], tmp_path)
    assert found is not None and found.path == tmp_path / "elsewhere"  # the command line wins


def test_an_out_dir_assignment_in_a_script_that_is_not_nanogpt_is_not_taken(tmp_path: Path) -> None:
    (tmp_path / "eval.py").write_text("out_dir = 'results'\n")
    assert dir_from_command(["python", "eval.py"], tmp_path) is None
    assert dir_from_command(["python", "missing.py"], tmp_path) is None


def test_the_repositorys_nanogpt_job_is_found_by_its_default() -> None:
    jobs = Path(__file__).resolve().parents[1] / "trainer_scripts"
    found = dir_from_command(["python", str(jobs / "nanogpt_train.py")], W)
    assert found is not None and found.path == W / "out"


def test_a_home_of_an_unknown_user_is_taken_as_written_not_an_error() -> None:
    found = dir_from_command(["python", "t.py", "--output_dir", "~no_such_user_tsup/out"], W)
    assert found is not None and found.path == W / "~no_such_user_tsup/out"
