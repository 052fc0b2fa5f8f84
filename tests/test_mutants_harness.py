"""Issue 38 part 6: the mutation harness (scripts/mutants.py) runs the suite as CI does. It used to
set PYTHONPATH to the mutant's tree, under which two install tests fail on unmutated code: every
mutation that survived its hint files was then reported "caught". A mutation no test can see
(a comment) must come out "missed", and every process a test starts must import the mutant."""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _mutants() -> Any:
    spec = importlib.util.spec_from_file_location("tsup_mutants", ROOT / "scripts" / "mutants.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass looks its module up while being made
    spec.loader.exec_module(mod)
    return mod


def test_the_mutant_environment_is_cis_every_process_imports_the_mutant(tmp_path: Path):
    mod = _mutants()
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "supervisor", tree / "supervisor", ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "supervisor" / "mutant_mark.py").write_text("HERE = True\n")  # only the copy has it
    py, env = mod.ci_env(tree, tmp_path / "venv")
    assert "PYTHONPATH" not in env
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    probe = "import supervisor, supervisor.mutant_mark, torch, structlog; print(supervisor.__file__)"
    cp = subprocess.run([str(py), "-c", probe], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0 and cp.stdout.strip() == str(tree / "supervisor" / "__init__.py"), cp.stderr
    tool = shutil.which("transformer-supervisor", path=env["PATH"])
    assert tool is not None and Path(tool).read_text().splitlines()[0] == f"#!{py}"
    cp = subprocess.run([tool, "--version"], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0 and cp.stdout.startswith("transformer-supervisor"), cp.stderr
    spy = shutil.which("py-spy", path=env["PATH"])  # the venv's binaries too
    assert spy is not None and Path(spy).resolve() == (Path(sys.executable).parent / "py-spy").resolve()


@pytest.mark.slow  # a venv, a wheel built and installed by the install tests (~30 s)
def test_a_known_surviving_mutation_is_reported_missed(tmp_path: Path):
    mod = _mutants()
    survivor = mod.Mutation(
        "a comment changed (no test can tell)", "supervisor/job/argvarea.py",
        "# bytes kept free beyond the job's argv", "# (changed by the harness's own test)",
        ("tests/cli/test_install.py",))  # the file that failed on unmutated code under PYTHONPATH
    result, detail, _ = mod.run(survivor, tmp_path, suite=survivor.hint)
    assert (result, detail) == ("missed", "tests/cli/test_install.py passed")
