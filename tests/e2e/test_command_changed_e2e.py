"""A second `wrap` with another command on an unfinished run's state dir (issue 37 part 7): the
run is continued, as the requeue path wants, but never silently: `run_command_changed` says at
start both commands and which run continues, on the console and in `history`."""
from __future__ import annotations

import sys
from pathlib import Path

from tests.conftest import history
from tests.util import wait_for

PY = sys.executable
WAITS = "import time\nwhile True:\n    time.sleep(0.2)"  # until the stop verb's SIGTERM


def _status(sd: Path) -> dict:
    from supervisor.ops.control import ControlError, DaemonNotRunning
    from supervisor.ops.controlclient import request

    try:
        return request(sd, "status", timeout=10.0)
    except (DaemonNotRunning, ControlError, OSError):
        return {}


def test_a_second_wrap_with_another_command_says_the_run_it_continues(daemons, tmp_path: Path) -> None:
    from supervisor.ops.controlclient import request

    sd = tmp_path / "sd"
    first = [PY, "-c", WAITS]
    d = daemons(["wrap", "--state-dir", str(sd), "--", *first])
    wait_for(lambda: _status(sd).get("pids"), 60, what="the first job running")  # silent: "starting"
    request(sd, "stop", timeout=30.0)
    assert d.wait(60) == 0, d.stderr()[-3000:]
    assert "run_command_changed" not in d.stderr()  # a new run: nothing to compare with
    (run_id,) = {history(sd)["run_id"]}

    second = [PY, "-c", "print('the second job', flush=True)"]
    d = daemons(["wrap", "--state-dir", str(sd), "--", *second])
    assert d.wait(60) == 0, d.stderr()[-3000:]
    err = d.stderr()
    said = [line for line in err.splitlines() if "run_command_changed" in line]
    assert len(said) == 1, err[-3000:]
    assert "time.sleep(0.2)" in said[0] and "was last started with" in said[0], said[0]  # the old command
    assert "the second job" in said[0] and f"Run {run_id} continues with the new command" in said[0], said[0]

    h = history(sd)
    assert h["run_id"] == run_id and [a["argv"] for a in h["attempts"]] == [first, second]
    (ev,) = [e for e in h["events"] if e["event"] == "run_command_changed"]
    assert ev["data"]["old_command"] == first and ev["data"]["new_command"] == second, ev
    assert ev["level"] == "warning" and f"run {run_id}" in ev["message"], ev


def test_the_same_command_or_none_recorded_is_not_said() -> None:
    from supervisor.config.model import config_from_table
    from supervisor.daemon.recovery import say_command_change
    from supervisor.job.launch import config_json

    cfg = config_from_table({"job": {"command": [PY, "train.py", "--token", "s3cr3t-value"]}}, "test")
    said: list[tuple] = []
    say = lambda *a, **k: said.append((a, k))  # noqa: E731
    say_command_change(config_json(cfg), "r1", cfg, say)  # the same (as stored: the token masked)
    say_command_change(None, "r1", cfg, say)  # nothing readable recorded
    say_command_change({"job": {}}, "r1", cfg, say)  # a run from before the command was stored
    assert said == []
    other = config_from_table({"job": {"command": [PY, "train.py", "--token", "another-value"]}}, "test")
    say_command_change(config_json(other), "r1", cfg, say)  # only a secret differs: masked alike, not said
    assert said == []
    shell = config_from_table({"job": {"command": [f"{PY} train.py"], "shell": True}}, "t")
    say_command_change(config_json(shell), "r1", cfg, say)  # one string for /bin/sh: another command
    assert len(said) == 1 and "s3cr3t" not in repr(said), said  # the ledger's (masked) form of both
    assert said[0][1] == {"old_command": [f"{PY} train.py"], "new_command": [PY, "train.py", "--token", "<redacted>"]}
