"""`status` during the daemon's start (issue 34 part 7): the control socket is up before the
concerns after it have started; a status then used to build the full answer from concerns not
started yet (an AssertionError, replied as `internal` with an empty message). It now answers the
state it has: `starting`, the run id, and that the daemon is starting.

The real daemon (build_daemon: the real ledger, socket, keeper and job), run in this process so
the test can hold one concern's start while it asks over the real socket."""
from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from supervisor.config.model import config_from_table
from supervisor.daemon import watchconcern
from supervisor.daemon.wiring import build_daemon
from supervisor.ops.controlclient import request
from tests.util import wait_for


def test_status_while_the_concerns_start_answers_starting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sd = tmp_path / "sd"
    entered, release = threading.Event(), threading.Event()
    real_start = watchconcern.WatchPlugin.started

    def held_start(self: Any, n: Any, run: Any) -> Any:  # the plug-in right after the control socket's
        entered.set()
        release.wait(60)
        return real_start(self, n, run)

    monkeypatch.setattr(watchconcern.WatchPlugin, "started", held_start)
    cfg = config_from_table({"job": {"command": [sys.executable, "-c", "print('step 1 loss 1.0')"]},
                             "state": {"dir": str(sd)}}, "test")
    with open("/dev/null", "wb") as devnull:
        runner = build_daemon(cfg, passthrough=devnull)
        codes: list[int] = []
        t = threading.Thread(target=lambda: codes.append(runner.run()), daemon=True)
        t.start()
        try:
            assert entered.wait(60)
            st = request(sd, "status", {})
            assert st["state"] == "starting" and st["phase"] == "daemon_starting", st
            assert st["run_id"] == runner.run_id and st["pids"] == [] and st["attempt"] == 0
            assert "the daemon is starting" in st["message"]
        finally:
            release.set()
        t.join(60)
    assert codes == [0]
    # Once started, the same socket answers from the machine as before.
    wait_for(lambda: not t.is_alive(), timeout=5)
