"""The type checker and the linter run with the suite, so `.ci/run` fails on a new error.

mypy: every module at least checked (untyped bodies too), the pure core and the daemon's loop
with every function typed (pyproject.toml [tool.mypy]); tests/ and bench/ at mypy's default level
(typed functions checked, imports followed silently), an unused `type: ignore` an error there too.
ruff: pyflakes, pycodestyle's errors, bugbear and unused `noqa` (pyproject.toml [tool.ruff]). No
blanket ignores: an ignore names its error code.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_finds_no_error() -> None:
    cp = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(ROOT / ".mypy_cache")], cwd=ROOT,
                        capture_output=True, text=True, timeout=600)
    assert cp.returncode == 0, cp.stdout[-4000:] + cp.stderr[-2000:]


@pytest.mark.slow
def test_mypy_reads_tests_and_bench() -> None:
    """tests/ and bench/ at mypy's default level: typed functions checked, the package's imports
    followed silently (its own errors are the test above's)."""
    cp = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(ROOT / ".mypy_cache" / "tests-bench"),
                         "--follow-imports=silent", "--no-check-untyped-defs", "--exclude", "^tests/corpus/",
                         "tests", "bench"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert cp.returncode == 0, cp.stdout[-4000:] + cp.stderr[-2000:]


def test_ruff_finds_no_error() -> None:
    cp = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "supervisor", "tests", "bench",
                         "scripts"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0, cp.stdout[-4000:] + cp.stderr[-2000:]


def test_no_blanket_ignores() -> None:
    files = [p for d in ("supervisor", "tests", "bench") for p in (ROOT / d).rglob("*.py")
             if p != Path(__file__).resolve() and "corpus" not in p.relative_to(ROOT).parts]
    bare = [f"{p.relative_to(ROOT)}:{i}" for p in files
            for i, line in enumerate(p.read_text().splitlines(), 1)
            if re.search(r"# type: ignore(?!\[)", line) or "mypy: ignore-errors" in line]
    assert not bare, f"type: ignore without an error code: {bare}"
