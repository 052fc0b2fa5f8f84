"""The job's process tree walked on a thread (job/treewalk.py), with real processes: the leader's
descendants, the orphans that carry the attempt's marker (and only those), a walk that fails."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from supervisor.job.osapi import OsApi, ProcRef
from supervisor.job.process import attempt_markers
from supervisor.job.treewalk import TreeWalker, walk
from tests.util import wait_for

PY = sys.executable
# A leader with a child and a grandchild, each writing its pid, then waiting.
TREE = r'''
import os, sys, time
out = sys.argv[1]
if os.fork() == 0:
    if os.fork() == 0:
        open(os.path.join(out, "grandchild"), "w").write(str(os.getpid()))
        time.sleep(600)
    open(os.path.join(out, "child"), "w").write(str(os.getpid()))
    time.sleep(600)
time.sleep(600)
'''


@pytest.fixture
def tree(tmp_path: Path):
    p = subprocess.Popen([PY, "-c", TREE, str(tmp_path)], start_new_session=True)
    try:
        def pids() -> set[int] | None:
            texts = [(tmp_path / n).read_text() if (tmp_path / n).exists() else "" for n in ("child", "grandchild")]
            return {int(t) for t in texts} if all(texts) else None

        kids = wait_for(pids, 30)
        yield p.pid, kids
    finally:
        os.killpg(p.pid, 9)
        p.wait()


def test_walk_finds_the_leaders_descendants_and_not_the_leader(tree) -> None:
    leader, kids = tree
    found = walk(OsApi(), leader, (), frozenset({leader}))
    assert {r.pid for r in found} == kids
    assert all(r.alive() for r in found)  # with their start times: a reused pid is not taken for them
    assert walk(OsApi(), None, (), frozenset()) == []  # the leader exited: no tree to walk
    # One pass answers several roots: the leader's and the child's trees (the child's holds the
    # grandchild alone); a pid with no children has none.
    [child] = [k for k in kids if psutil.Process(k).ppid() == leader]
    trees = OsApi().descendants_of((leader, child, max(kids) + 10**6))
    assert {r.pid for r in trees[leader]} == kids and {r.pid for r in trees[child]} == kids - {child}
    assert trees[max(kids) + 10**6] == []


def test_walk_takes_orphans_with_the_attempts_marker_only(tmp_path: Path) -> None:
    """Children of this process stand in for the daemon's re-parented orphans."""
    env = {**os.environ, "TSUP_RUN_ID": "r1", "TSUP_ATTEMPT": "3"}
    ours = subprocess.Popen(["sleep", "600"], env=env)
    other = subprocess.Popen(["sleep", "600"], env={**env, "TSUP_ATTEMPT": "2"})
    # Issue 34: forked by the prewarm runner that runs attempt 3 (its environ: no TSUP_ATTEMPT, its mark).
    runners = {"TSUP_RUN_ID": "r1", "TSUP_STANDBY": "ab12"}
    forked = subprocess.Popen(["sleep", "600"], env={**os.environ, **runners})
    next_standby = subprocess.Popen(["sleep", "600"], env={**os.environ, **runners, "TSUP_STANDBY": "cd34"})
    try:
        markers = attempt_markers(env, "TSUP_STANDBY=ab12")
        assert markers == ((b"TSUP_RUN_ID=r1", b"TSUP_ATTEMPT=3"), (b"TSUP_STANDBY=ab12",))
        pids = {r.pid for r in walk(OsApi(), None, markers, frozenset())}
        assert ours.pid in pids and forked.pid in pids and other.pid not in pids and next_standby.pid not in pids
        assert ours.pid not in {r.pid for r in walk(OsApi(), None, markers, frozenset({ours.pid}))}  # known: skipped
        assert forked.pid not in {r.pid for r in walk(OsApi(), None, markers[:1], frozenset())}  # not run by a runner
        # No full marker (no TSUP_ATTEMPT): no orphan is the job's, not even one with the run id.
        assert attempt_markers({"TSUP_RUN_ID": "r1"}) == () and walk(OsApi(), None, (), frozenset()) == []
    finally:
        for p in (ours, other, forked, next_standby):
            p.kill()
            p.wait()


def test_the_walker_runs_off_the_callers_thread_and_hands_the_result_to_a_later_poll(tree) -> None:
    leader, kids = tree
    seen: list[str] = []

    class Watched(OsApi):
        def descendants_of(self, roots: tuple[int, ...]) -> dict[int, list[ProcRef]]:
            seen.append(threading.current_thread().name)
            return super().descendants_of(roots)

    walker = TreeWalker(Watched())
    try:
        assert walker.poll(leader, (), frozenset({leader})) == []  # started: nothing found yet
        found = wait_for(lambda: walker.poll(leader, (), frozenset({leader})), 30)
        assert {r.pid for r in found} == kids
        assert seen and all(n.startswith("job-tree-walk") for n in seen)
    finally:
        walker.close()


def test_a_walk_that_fails_is_said_and_the_next_one_runs(tree, capsys) -> None:
    leader, kids = tree
    calls: list[int] = []

    class FailsOnce(OsApi):
        def descendants_of(self, roots: tuple[int, ...]) -> dict[int, list[ProcRef]]:
            calls.append(len(roots))
            if len(calls) == 1:
                raise RuntimeError("proc went away")
            return super().descendants_of(roots)

    walker = TreeWalker(FailsOnce())
    try:
        walker.poll(leader, (), frozenset({leader}))
        found = wait_for(lambda: walker.poll(leader, (), frozenset({leader})), 30)
        assert {r.pid for r in found} == kids and len(calls) >= 2
        said = capsys.readouterr()
        assert "job_tree_walk_failed" in said.out + said.err
    finally:
        walker.close()
