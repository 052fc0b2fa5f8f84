"""Bad config input through the real CLI is a message and exit 2, never a traceback (issue 24
build 6): invalid UTF-8, TOML nested 5,000 deep, a FIFO (must not block), a directory, a file above
the size bound, a scale remedy on a flag whose value is nan,
`command = [""]`."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCALE_NAN = ('[job]\ncommand = ["python", "train.py", "--lr", "nan"]\n'
             '[on.nan]\nremedies = [{ scale = { "--lr" = 0.5 } }]\n')


def _check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", "check-config", str(path)],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("case,expect", [
    ("utf8", "not valid UTF-8"), ("deep", "nested too deeply"), ("fifo", "not a regular file"),
    ("dir", "is a directory"), ("big", "larger than"), ("scale_nan", "not finite"), ("empty_program", "is empty"),
])
def test_check_config_names_the_problem_without_a_traceback(tmp_path: Path, case: str, expect: str) -> None:
    path = tmp_path / "c.toml"
    if case == "utf8":
        path.write_bytes(b'[job]\ncommand = ["python", "\xff"]\n')
    elif case == "deep":
        path.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    elif case == "fifo":
        os.mkfifo(path)  # nobody writes it: an open that blocks would hang check-config
    elif case == "dir":
        path.mkdir()
    elif case == "big":
        path.write_text("# " + "x" * (2 << 20) + "\n")
    elif case == "empty_program":
        path.write_text('[job]\ncommand = [""]\n')
    else:
        path.write_text(SCALE_NAN)
    r = _check(path)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    out = r.stdout + r.stderr
    assert expect in out and "Traceback" not in out, out
