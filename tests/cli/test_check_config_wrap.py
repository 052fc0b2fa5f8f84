"""`check-config --for wrap` and a scale remedy (issue 37 part 10): the remedy multiplies a flag of
the command, which wrap takes from its own arguments. Without the command the check cannot say
whether wrap will accept it: it says so (exit 2, naming the remedy and why); with the command
after `--` it answers as wrap does."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

PY = sys.executable
SCALED = '[on.nan]\naction = "rollback"\nremedies = [{ args = ["--fresh"] }, { scale = { "--lr" = 0.5 } }]\n'


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "supervisor", *args], cwd=str(ROOT), capture_output=True, text=True, timeout=60)


def test_a_scale_remedy_is_not_passed_unchecked_and_the_command_checks_it_as_wrap_does(daemons, tmp_path: Path):
    conf = tmp_path / "w.toml"
    conf.write_text(SCALED)
    cp = cli("check-config", "--for", "wrap", str(conf))
    assert cp.returncode == 2 and "OK" not in cp.stdout
    [problem] = [ln for ln in cp.stderr.splitlines() if ln.startswith("  - ")]
    assert problem.startswith("  - on.nan.remedies[1].scale.--lr: a scale remedy multiplies --lr's value"), problem
    assert "cannot be checked" in problem and "check-config --for wrap PATH -- CMD ARGS..." in problem

    without = ["--", PY, "-c", "pass"]
    with_flag = [*without, "--lr", "0.1"]
    cp = cli("check-config", "--for", "wrap", str(conf), *without)
    assert cp.returncode == 2 and "on.nan.remedies[1].scale.--lr: --lr is not in job.command" in cp.stderr
    cp = cli("check-config", "--for", "wrap", str(conf), *with_flag)
    assert cp.returncode == 0 and "OK for wrap --config" in cp.stdout, cp.stderr
    cp = cli("check-config", str(conf), *with_flag)  # run reads the command from the file
    assert cp.returncode == 2 and "--for wrap" in cp.stderr

    # wrap answers the same for the same commands.
    d = daemons(["wrap", "--config", str(conf), "--state-dir", str(tmp_path / "a"), *without])
    assert d.wait(60) == 2 and "on.nan.remedies[1].scale.--lr: --lr is not in job.command" in d.stderr()
    d = daemons(["wrap", "--config", str(conf), "--state-dir", str(tmp_path / "b"), *with_flag])
    assert d.wait(60) == 0, d.stderr()[-2000:]


def test_a_file_with_its_own_command_is_checked_against_it(tmp_path: Path):
    """A wrap file that names the command itself needs nothing more to be checked."""
    conf = tmp_path / "own.toml"
    conf.write_text(f'[job]\ncommand = ["{PY}", "-c", "pass", "--lr", "0.1"]\n' + SCALED)
    cp = cli("check-config", "--for", "wrap", str(conf))
    assert cp.returncode == 0 and "OK for wrap --config" in cp.stdout, cp.stderr
