"""Issue 38 part 2: a job started in the standby runner ([job] prewarm) looks like itself from
outside: /proc/PID/cmdline, ``ps -o args``, ``pgrep -f`` and py-spy show its own command line, and
its ``sys.orig_argv`` is the cold start's; each compared with a cold run of the same command."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

import pytest

from supervisor.job import argvarea
from supervisor.job.prewarm import Plan, Prewarm, Standby, plan
from supervisor.watch.stacks import find_py_spy

PY = sys.executable

# What the outside sees of the job, from the job itself; then it waits (a poll with a deadline)
# for the file named last in its argv, while the test looks at it with py-spy.
LOOKS = """
import json, os, subprocess, sys, time
me = str(os.getpid())
ps = subprocess.run(["ps", "-ww", "-o", "args=", "-p", me], capture_output=True, text=True).stdout.strip()
pgrep = subprocess.run(["pgrep", "-f", "looks.py --marker"], capture_output=True, text=True).stdout.split()
print(json.dumps({"cmdline": open("/proc/self/cmdline", "rb").read().rstrip(b"\\0").decode(), "ps": ps,
                  "pgrep": me in pgrep, "orig_argv": sys.orig_argv, "argv": sys.argv}), flush=True)
deadline = time.monotonic() + 60
while not os.path.exists(sys.argv[-1]) and time.monotonic() < deadline:
    time.sleep(0.02)
"""


def _env() -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("TSUP_")}, "PYTHONUNBUFFERED": "1"}


def _observe(pid: int, out: IO[str], release: Path) -> dict[str, Any]:
    """The job's own report, py-spy's first line about it, and the raw cmdline (trailing NULs
    are the argv area's room: every reader drops them)."""
    seen = json.loads(out.readline())
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        seen["raw"] = f.read().rstrip(b"\0")
    spy = find_py_spy()
    assert spy is not None, "py-spy is a dependency of the install"
    cp = subprocess.run([spy, "dump", "--nonblocking", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
    seen["py-spy"] = next((ln for ln in cp.stdout.splitlines() if ln.startswith("Process ")), cp.stderr)
    seen["py-spy"] = seen["py-spy"].replace(str(pid), "PID")  # "Process PID: <its command line>"
    release.touch()
    return seen


def _cold(cwd: Path, argv: list[str], release: Path) -> dict[str, Any]:
    p = subprocess.Popen(argv, cwd=cwd, env=_env(), stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    with p.stdout:
        seen = _observe(p.pid, p.stdout, release)
    assert p.wait(60) == 0
    return seen


def _warm(sb: Standby, p: Plan, cwd: Path, argv: list[str], release: Path) -> dict[str, Any]:
    out_r, out_w = os.pipe()
    err_w = os.open(os.devnull, os.O_WRONLY)
    try:
        assert sb.hand_over(p, argv, _env(), str(cwd), out_w, err_w, "") is None
    finally:
        os.close(out_w)
        os.close(err_w)
    assert sb.note == ""  # the argv area was written
    with os.fdopen(out_r) as out:
        seen = _observe(sb.pid, out, release)
    assert sb.popen.wait(60) == 0
    return seen


@pytest.mark.parametrize("args", [["--marker", "1"], ["--marker", "x" * 3000, "--lr=3e-4", "sp ace", "ünï"]],
                         ids=["short", "longer-than-the-standby's-own"])
def test_a_job_in_the_standby_shows_its_own_command_line_as_a_cold_start_does(tmp_path: Path, args):
    (tmp_path / "looks.py").write_text(LOOKS)
    argv = [PY, "looks.py", *args]
    cold = _cold(tmp_path, argv + [str(tmp_path / "cold.done")], tmp_path / "cold.done")
    p = plan(argv + [str(tmp_path / "warm.done")])
    assert isinstance(p, Plan)
    warm = _warm(Standby(p, _env(), str(tmp_path), "", nice=False), p, tmp_path, p.argv(), tmp_path / "warm.done")
    for seen, done in ((cold, "cold.done"), (warm, "warm.done")):
        assert seen["pgrep"], seen  # pgrep -f finds it by its script and flags
        assert seen["orig_argv"] == [*argv, str(tmp_path / done)]
        assert seen["argv"] == ["looks.py", *args, str(tmp_path / done)]
    # Everything the outside reads is the cold start's (but the release file's name).
    swap = {k: (v.replace("warm.done", "cold.done") if isinstance(v, str) else v) for k, v in warm.items()}
    swap["raw"] = warm["raw"].replace(b"warm.done", b"cold.done")
    swap["orig_argv"] = [a.replace("warm.done", "cold.done") for a in warm["orig_argv"]]
    swap["argv"] = [a.replace("warm.done", "cold.done") for a in warm["argv"]]
    assert swap == cold
    assert cold["raw"] == b"\0".join(os.fsencode(a) for a in argv + [str(tmp_path / "cold.done")])
    assert "standby.py" not in cold["ps"] + swap["ps"] + str(swap.get("py-spy"))


def test_the_next_attempts_standby_shows_its_argv_when_prewarmed(tmp_path: Path):
    """Through Prewarm, as the daemon does: the standby started for attempt 0's command runs
    attempt 1 with a resume flag added (an argv longer than the one it was started for)."""
    (tmp_path / "looks.py").write_text(LOOKS)
    done = tmp_path / "done"
    pw = Prewarm()
    first = plan([PY, "looks.py", "--marker", str(done)])
    assert isinstance(first, Plan)
    pw._start(first, _env(), str(tmp_path), "", None, "unused")
    argv = [PY, "looks.py", "--marker", "--resume_from_checkpoint=" + str(tmp_path / "ck" / "step_1000.pt"), str(done)]
    p, sb, why = pw.take(argv, _env(), str(tmp_path))
    assert p is not None and sb is not None, why
    seen = _warm(sb, p, tmp_path, argv, done)
    assert seen["raw"] == b"\0".join(os.fsencode(a) for a in argv) and seen["orig_argv"] == argv
    assert seen["ps"] == " ".join(argv) and seen["pgrep"]
    pw.close()


def test_the_argv_area_layout_exact_cut_and_room():
    argv = ["python", "train.py", "--lr", "1"]
    assert argvarea.layout(argv, 40) == b"python\0train.py\0--lr\0" + b"1\0" + b"\0" * 17
    assert argvarea.layout(argv, 10) == b"python tr\0"  # too long: joined by spaces, cut, NUL-ended
    own = ["python", "/x/standby.py", "5", "{}"]
    room = argvarea.padding(argv, own)
    assert len(argvarea.encoded(own + [room])) >= 2 * len(argvarea.encoded(argv)) and set(room) == {" "}
    assert argvarea.padding(argv, own + ["y" * 10_000]) == ""  # its own argv is long enough already
    assert len(argvarea.padding(["x" * 500_000], own)) == argvarea.ROOM_MAX  # one argument's limit
