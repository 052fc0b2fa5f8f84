"""[job] prewarm with real processes: the standby runner runs a script or a module exactly as the
interpreter would (compared with a cold run of the same command), records its imports, preloads
only installed modules, and any doubt about a standby makes the attempt cold with its reason."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from supervisor.config.model import ConfigSource
from supervisor.job import standby
from supervisor.job.prewarm import Plan, Prewarm, Standby, plan
from tests.conftest import pid_alive
from tests.util import wait_for

if TYPE_CHECKING:
    from supervisor.job.process import LaunchSpec

PY = sys.executable

# Says everything a job can see of how it was started; exits with argv[-1] (an int, or a message).
SHOW = """
import json, os, sys
print(json.dumps({"argv": sys.argv, "name": __name__, "cwd": os.getcwd(), "path0": sys.path[0],
                  "attempt": os.environ.get("TSUP_ATTEMPT"), "mark": os.environ.get("MARK"),
                  "spec": getattr(__spec__, "name", None), "file": __file__}), flush=True)
print("to stderr", file=sys.stderr, flush=True)
how = sys.argv[-1]
if how == "raise":
    def inner():
        raise ValueError("the job's own error")
    inner()
sys.exit(int(how) if how.lstrip("-").isdigit() else how)
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TSUP_")}
    return {**env, "PYTHONUNBUFFERED": "1", "TSUP_ATTEMPT": "1", "MARK": "m1", **extra}


def _read(fd: int) -> str:
    chunks = []
    while True:
        b = os.read(fd, 65536)
        if not b:
            break
        chunks.append(b)
    os.close(fd)
    return b"".join(chunks).decode()


def in_standby(cwd: Path, argv: list[str], env: dict[str, str], log: str = "") -> tuple[int, str, str]:
    p = plan(argv)
    assert isinstance(p, Plan), p
    sb = Standby(p, env, str(cwd), "", nice=False)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        assert sb.hand_over(p, argv, env, str(cwd), out_w, err_w, log) is None
    finally:
        os.close(out_w)
        os.close(err_w)
    out, err = _read(out_r), _read(err_r)  # small outputs: the pipes never fill
    return sb.popen.wait(30), out, err


def cold(cwd: Path, argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    cp = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=30)
    return cp.returncode, cp.stdout, cp.stderr


def _with_standby(tmp_path: Path, env: dict[str, str]) -> tuple[Prewarm, list[str]]:
    """A Prewarm holding one standby for ``show.py 0`` in ``tmp_path``, started with ``env``."""
    (tmp_path / "show.py").write_text(SHOW)
    argv = [PY, "show.py", "0"]
    pw = Prewarm()
    p = plan(argv)
    assert isinstance(p, Plan)
    pw._start(p, env, str(tmp_path), "", None, "unused")
    return pw, argv


@pytest.mark.parametrize("how", ["3", "0", "raise", "a message"])
def test_a_script_in_the_standby_sees_what_a_cold_start_sees_and_exits_the_same(tmp_path, how):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "show.py").write_text(SHOW)
    argv, env = [PY, "sub/show.py", "--flag", how], _env()
    log = tmp_path / "attempt-1.modules"
    warm = in_standby(tmp_path, argv, env, str(log))
    assert warm == cold(tmp_path, argv, env)  # argv, __name__, cwd, sys.path[0], env, output, exit status
    assert '"name": "__main__"' in warm[1] and '"mark": "m1"' in warm[1]
    if how == "raise":  # the traceback as Python prints it: the job's frames, none of ours
        assert "standby.py" not in warm[2] and "runpy" not in warm[2] and "the job's own error" in warm[2]
    assert "json" in log.read_text().split()  # the job's imports recorded for the next standby


def test_a_module_runs_as_python_dash_m_runs_it(tmp_path):
    (tmp_path / "showmod.py").write_text(SHOW)
    argv, env = [PY, "-u", "-m", "showmod", "x", "7"], _env(MARK="m2")
    warm = in_standby(tmp_path, argv, env)
    assert warm == cold(tmp_path, argv, env)
    assert warm[0] == 7 and '"spec": "showmod"' in warm[1]


def test_only_installed_modules_are_preloaded_never_the_jobs_own(tmp_path):
    (tmp_path / "mylocal.py").write_text("open('side-effect', 'w')\n")
    (tmp_path / "email").mkdir()  # shadows the standard library's: the job imports this one
    allowed = standby.Allowed(standby.install_roots(), [str(tmp_path)])
    assert allowed("json") and allowed("xml.dom.minidom") and allowed("pytest")  # stdlib, site-packages
    assert not allowed("mylocal") and not allowed("email.mime")  # found in the job's folder
    assert not allowed("supervisor.client")  # ours: reads the attempt's TSUP_* variables
    assert not allowed("no_such_module_here") and not allowed("__main__")
    assert not standby.preload("mylocal", allowed)
    assert not (tmp_path / "side-effect").exists()


@pytest.mark.parametrize("argv, why", [
    (["torchrun", "--nproc-per-node=2", "train.py"], "not a plain Python job"),
    (["accelerate", "launch", "train.py"], "not a plain Python job"),
    (["/bin/sh", "-c", "python train.py"], "not a plain Python job"),
    (["python3", "-c", "print(1)"], "interpreter option -c"),
    (["python3-config", "x.py"], "not a plain Python job"),
    (["python"], "no script or module"),
])
def test_anything_but_a_plain_python_job_is_cold_with_its_reason(argv, why):
    got = plan(argv)
    assert isinstance(got, str) and why in got


def test_plain_python_jobs_are_planned_with_their_options():
    assert plan(["/v/bin/python3.11", "-u", "-X", "dev", "train.py", "--lr", "1"]) == Plan(
        "/v/bin/python3.11", ("-u", "-X", "dev"), "script", "train.py", ("--lr", "1"))
    assert plan(["python", "-m", "pkg.train", "-m", "x"]) == Plan("python", (), "module", "pkg.train", ("-m", "x"))


def test_a_changed_environment_variable_makes_the_attempt_cold_and_the_standby_goes(tmp_path):
    pw, argv = _with_standby(tmp_path, _env(TSUP_ATTEMPT="0"))
    sb = pw._standby
    assert sb is not None and "TSUP_ATTEMPT" not in sb.env  # never found as the running attempt's
    # The per-attempt variables may differ; any other may have been read at import time.
    assert pw.take(argv, _env(TSUP_ATTEMPT="1"), str(tmp_path))[1] is sb
    pw._standby = sb
    _, got, why = pw.take(argv, _env(CUDA_VISIBLE_DEVICES="1"), str(tmp_path))
    assert got is None and why == "environment variable CUDA_VISIBLE_DEVICES changed"
    wait_for(lambda: not pid_alive(sb.pid), what="the refused standby to be gone")
    pw.close()


def test_a_standby_that_died_is_a_reason_not_an_error(tmp_path):
    env = _env()
    pw, argv = _with_standby(tmp_path, env)
    assert pw._standby is not None
    pw._standby.popen.kill()
    pw._standby.popen.wait(10)
    _, got, why = pw.take(argv, env, str(tmp_path))
    assert got is None and why.startswith("the standby exited")


def test_a_reload_that_changes_the_job_discards_the_standby_one_that_does_not_keeps_it(tmp_path):
    import threading

    from tests.fakes import close_all, daemon

    d = daemon(tmp_path)
    try:
        toml = tmp_path / "tsup.toml"
        base = f'[job]\ncommand = ["python", "train.py"]\nworkdir = "{tmp_path}"\n[state]\ndir = "{tmp_path / "state"}"\n'
        d.runner.config_source = ConfigSource.of_file(toml)
        for text, discarded in ((base + "[policy]\nmax_restarts = 7\n", False),
                                (base.replace("[state]", 'env = { CUDA_VISIBLE_DEVICES = "1" }\n[state]'), True)):
            toml.write_text(text)
            out: dict = {}
            t = threading.Thread(target=lambda: out.update(r=d.runner.control("reload", {}, timeout=5.0)))
            t.start()
            while t.is_alive():
                d.step()
            assert out["r"]["reloaded"]
            assert getattr(d.launcher, "standby_discarded", False) is discarded
    finally:
        close_all()


def test_discard_kills_the_standby_and_the_next_launch_finds_none(tmp_path):
    env = _env()
    pw, argv = _with_standby(tmp_path, env)
    sb = pw._standby
    assert sb is not None
    pw.discard()
    wait_for(lambda: not pid_alive(sb.pid), what="the discarded standby to be gone")
    assert pw.take(argv, env, str(tmp_path))[2].startswith("no standby was ready")


def _spec(tmp_path: Path, env: dict[str, str]) -> "LaunchSpec":
    from supervisor.job.process import LaunchSpec

    (tmp_path / "show.py").write_text(SHOW)
    env = {**env, "TSUP_STATE_DIR": str(tmp_path / "state"), "TSUP_ATTEMPT": "0", "TSUP_RUN_ID": "r1"}
    return LaunchSpec((PY, "show.py", "0"), str(tmp_path), env, {}, cgroup=False, prewarm=True)


def test_the_standby_is_due_at_the_launch_and_starts_only_steady_s_after_the_first_step(tmp_path, monkeypatch):
    from supervisor.job import prewarm

    monkeypatch.setattr(prewarm, "STEADY_S", 0.3)
    pw = Prewarm()
    try:
        pw.after_launch(_spec(tmp_path, _env()), None)
        assert pw.status()["state"] == "due" and pw._standby is None
        t0 = time.monotonic()
        pw.progressed(t0)
        pw.progressed(t0 + 0.01)  # later steps change nothing: one start, timed from the first
        block = wait_for(lambda: (b := pw.status()).get("state") == "ready" and b.get("rss_bytes") and b, 30,
                         what="the standby after its steady wait")
        assert time.monotonic() - t0 >= 0.3 and pid_alive(block["pid"]) and block["cpu_s"] >= 0
    finally:
        pw.close()


def test_a_discard_or_the_next_launch_before_the_wait_is_over_starts_no_standby(tmp_path, monkeypatch):
    import threading

    from supervisor.job import prewarm

    monkeypatch.setattr(prewarm, "STEADY_S", 0.2)
    pw = Prewarm()
    spec = _spec(tmp_path, _env())
    waits = []
    try:
        for cancel in (pw.discard, lambda: pw.after_launch(spec, None)):
            pw.after_launch(spec, None)
            pw.progressed(time.monotonic())
            cancel()
            waits += [t for t in threading.enumerate() if t.name == "prewarm-standby"]
        for t in waits:
            t.join(10)  # each steady wait is over, and found its attempt gone
        assert pw._standby is None and pw.status()["state"] in ("none", "due"), pw.status()
    finally:
        pw.close()
