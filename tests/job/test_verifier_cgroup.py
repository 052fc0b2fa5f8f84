"""Background verification in a cgroup of its own beside the job's (issue 25 build 2): each load
test's process is moved into ``tsup-verify-<daemon pid>``, which gets the idle CPU class or the
lowest CPU weight and the lowest IO weight where those controllers are delegated to us."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from supervisor.checkpoints.loadtest import LoadTests
from supervisor.job.cgroup import VERIFIER_PREFIX, VerifierCgroup, own_cgroup, set_weights
from tests.helpers import ckpt_factory as F
from tests.util import wait_for

PARENT, WHY = own_cgroup()
needs_cgroup = pytest.mark.skipif(PARENT is None, reason=f"no writable cgroup v2 here: {WHY}")


def _cgroup_of(pid: int) -> str:
    return next(line[3:].strip() for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
                if line.startswith("0::"))


@needs_cgroup
def test_a_process_entered_is_in_the_verifier_cgroup_and_it_is_removed_when_empty() -> None:
    cg = VerifierCgroup()
    proc = subprocess.Popen(["sleep", "60"])
    try:
        assert cg.enter(proc.pid)
        assert cg.path is not None and cg.path.name == f"{VERIFIER_PREFIX}{os.getpid()}"
        assert _cgroup_of(proc.pid).endswith("/" + cg.path.name)
        assert str(proc.pid) in (cg.path / "cgroup.procs").read_text().split()
    finally:
        proc.kill()
        proc.wait()
    path = cg.path
    wait_for(lambda: not (path / "cgroup.procs").read_text().strip(), 10, what="the killed process gone")
    cg.remove()
    assert not path.exists()


@needs_cgroup
def test_a_verifier_cgroup_removed_under_it_is_made_again() -> None:
    cg = VerifierCgroup()
    first = subprocess.Popen(["sleep", "60"])
    second = subprocess.Popen(["sleep", "60"])
    try:
        assert cg.enter(first.pid)
        first.kill()
        first.wait()
        path = cg.path
        assert path is not None
        wait_for(lambda: not (path / "cgroup.procs").read_text().strip(), 10, what="the killed process gone")
        path.rmdir()  # another daemon's sweep of empty tsup- cgroups
        assert cg.enter(second.pid) and _cgroup_of(second.pid).endswith("/" + path.name)
    finally:
        for p in (first, second):
            p.kill()
            p.wait()
    wait_for(lambda: not (path / "cgroup.procs").read_text().strip(), 10, what="the killed process gone")
    cg.remove()


def test_no_cgroup_of_ours_means_no_move_and_no_error() -> None:
    cg = VerifierCgroup(find_parent=lambda: (None, "no cgroup v2 hierarchy (cgroup v1 only)"))
    assert not cg.enter(os.getpid()) and cg.path is None
    cg.remove()  # nothing to remove: no error


def test_the_weights_are_written_where_the_controller_offers_them(tmp_path: Path) -> None:
    # Plain files stand in for a delegated cgroup's interface files: this host's cpu and io
    # controllers belong to cgroup v1, so no cgroup v2 here has cpu.weight or io.weight.
    (tmp_path / "cpu.weight").write_text("100\n")
    (tmp_path / "io.weight").write_text("default 100\n")
    assert set_weights(tmp_path) == {"cpu.weight": "1", "io.weight": "default 1"}  # no cpu.idle: an older kernel
    assert (tmp_path / "cpu.weight").read_text() == "1" and (tmp_path / "io.weight").read_text() == "default 1"
    assert not (tmp_path / "cpu.idle").exists()


@needs_cgroup
def test_each_load_test_process_runs_in_the_verifier_cgroup(tmp_path: Path) -> None:
    ck = F.torch_file(tmp_path / "ck" / "step_5.pt", 5)
    seen = tmp_path / "seen"
    # The job's interpreter stands in: it records its cgroup once it has been moved (the move
    # follows the start, a weight needs no more), then exits without a verdict.
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\ni=0\n"
                      "while [ $i -lt 400 ] && ! grep -q tsup-verify /proc/self/cgroup; do sleep 0.05; i=$((i+1)); done\n"
                      f"grep '^0::' /proc/self/cgroup > {seen}\nexit 0\n")
    python.chmod(0o755)
    cg = VerifierCgroup()
    tests = LoadTests(str(python), expected_keys=(), check_finite=False, trust_pickles=False, mmap=False,
                      timeout_s=60, cwd=None, cgroup=cg)
    assert not tests.run(ck, None).passed  # no verdict from the stand-in: only where it ran is checked
    assert seen.read_text().strip().endswith(f"/{VERIFIER_PREFIX}{os.getpid()}"), seen.read_text()
    assert tests.cancel() == []
    assert cg.path is None  # removed with the tests (empty: the stand-in has exited)
