"""The type checker and the linter run with the suite, so `.ci/run` fails on a new error.

mypy: every module at least checked (untyped bodies too), the pure core and the daemon's loop
with every function typed (pyproject.toml [tool.mypy]). ruff: pyflakes, pycodestyle's errors and
bugbear (pyproject.toml [tool.ruff]). No blanket ignores: an ignore names its error code.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_finds_no_error() -> None:
    cp = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(ROOT / ".mypy_cache")], cwd=ROOT,
                        capture_output=True, text=True, timeout=600)
    assert cp.returncode == 0, cp.stdout[-4000:] + cp.stderr[-2000:]


def test_ruff_finds_no_error() -> None:
    cp = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "supervisor", "tests", "bench",
                         "scripts"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0, cp.stdout[-4000:] + cp.stderr[-2000:]


def test_no_blanket_ignores() -> None:
    bare = [f"{p.relative_to(ROOT)}:{i}" for p in (ROOT / "supervisor").rglob("*.py")
            for i, line in enumerate(p.read_text().splitlines(), 1)
            if re.search(r"# type: ignore(?!\[)", line) or "mypy: ignore-errors" in line]
    assert not bare, f"type: ignore without an error code: {bare}"
