"""Each attempt's record of what it runs on. The environment probe (a subprocess of the job's
Python, git) runs beside the first launch, not before it: the job does not wait for it, and the
rows written before it came are completed when it does (issue 11: start-up before the first launch)."""
from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any, Mapping

from supervisor.daemon.recorder import Snapshots
from supervisor.daemon.effects import AttemptWriter
from supervisor.ledger.store import Ledger
from tests.conftest import history

PY = sys.executable


class SlowProbe:
    """The EnvironmentProbe port with a probe that answers when the test says so."""

    def __init__(self) -> None:
        self.result: dict[str, Any] | None = None
        self.arrived = threading.Event()

    def start(self, cfg: Any) -> None:
        pass

    def probed(self, wait: float = 0.0) -> Mapping[str, Any] | None:
        return self.result if self.arrived.wait(wait) else None

    def of_attempt(self, spec: Any, extra: Mapping[str, Any]) -> dict[str, Any]:
        return dict(extra)

    def answer(self) -> None:
        self.result = {"job_python": {"python": "3.x"}, "world": {"from": "probe"}}
        self.arrived.set()


def _rows(led: Ledger, run_id: str) -> dict[int, Any]:
    return {a["attempt"]: a["environment"] for a in led.history(run_id)["attempts"]}


def test_rows_written_before_the_probe_are_completed_when_it_comes(tmp_path: Path) -> None:
    led = Ledger(tmp_path)
    run_id, _ = led.open_run("job", {})
    for n in (0, 1):
        led.begin_attempt(run_id, n, ["python"], str(tmp_path), {}, None, None, None, [], None)
    probe = SlowProbe()
    snaps = Snapshots(AttemptWriter(led, lambda: run_id).write, probe)

    snaps.launched(0, {"world": {"world_size": 1}, "host": {"load": 1}})
    assert _rows(led, run_id)[0] == {"world": {"world_size": 1}, "host": {"load": 1}}  # written now, without it
    snaps.ended(0, lambda: {"host": {"load": 2}}, None, {"beats": 3})
    snaps.complete()  # not there yet: nothing changes, nothing raises
    probe.answer()
    snaps.complete()
    row0 = _rows(led, run_id)[0]
    assert row0["job_python"] == {"python": "3.x"}
    assert row0["world"] == {"world_size": 1}  # the attempt's own world wins over the probe's
    assert row0["at_end"]["host"] == {"load": 2} and row0["at_end"]["heartbeats"] == {"beats": 3}

    snaps.launched(1, {"world": {"world_size": 2}})  # after the probe: complete at once
    assert _rows(led, run_id)[1] == {"job_python": {"python": "3.x"}, "world": {"world_size": 2}}


def test_a_row_rewritten_after_the_probe_is_not_rolled_back_by_the_completion(tmp_path: Path) -> None:
    led = Ledger(tmp_path)
    run_id, _ = led.open_run("job", {})
    led.begin_attempt(run_id, 0, ["python"], str(tmp_path), {}, None, None, None, [], None)
    probe = SlowProbe()
    snaps = Snapshots(AttemptWriter(led, lambda: run_id).write, probe)
    snaps.launched(0, {"world": {}})
    probe.answer()
    snaps.ended(0, lambda: {}, None, None)  # the probe came between: this write is whole
    snaps.complete()
    assert "at_end" in _rows(led, run_id)[0] and "job_python" in _rows(led, run_id)[0]


def test_the_first_launch_does_not_wait_for_the_environment_probe(daemons, tmp_path: Path) -> None:
    # The job's Python (job.python, used only for the probe) blocks until the job has run: had the
    # launch waited for the probe, the job would never run and the probe would fail.
    ran = tmp_path / "job-ran"
    slow_python = tmp_path / "python-after-the-job"
    slow_python.write_text(f"#!/bin/sh\nwhile [ ! -e {ran} ]; do sleep 0.02; done\nexec {PY} \"$@\"\n")
    slow_python.chmod(0o755)
    cfg = tmp_path / "tsup.toml"
    cfg.write_text(f'[job]\npython = "{slow_python}"\n')
    sd = tmp_path / "sd"
    d = daemons(["wrap", "--state-dir", str(sd), "--config", str(cfg), "--", PY, "-c",
                 f"open({str(ran)!r}, 'w').close()"])
    assert d.wait() == 0
    env = history(sd)["attempts"][0]["environment"]
    # The daemon ended with the job, and still recorded what it ran on.
    assert env["job_python"]["python"] == ".".join(map(str, sys.version_info[:3])), env["job_python"]
    assert "at_end" in env and "hostname" in env
