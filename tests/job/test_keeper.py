"""The output keeper with real processes and files: job.log across logrotate, a full disk, a
planted symlink, and a keeper that dies."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Sequence

import pytest
from structlog.testing import capture_logs

from supervisor.job.osapi import OsApi
from supervisor.job.output import SinkFanout
from supervisor.job.process import MAX_KEEPER_RESPAWNS, JobProcess, LaunchSpec
from tests.util import wait_for

# Prints "line i" every 2 ms until the file named by argv[1] exists, then exits 0.
PRINTER = ("import os, sys, time\n"
           "i = 0\n"
           "while not os.path.exists(sys.argv[1]):\n"
           "    print('line', i, flush=True); i += 1; time.sleep(0.002)\n"
           "print('last', i, flush=True)\n")


class Lines:
    def __init__(self) -> None:
        self.got: list[str] = []
        self.lock = threading.Lock()

    def feed(self, source: str, lines: Sequence[str]) -> None:
        with self.lock:
            self.got.extend(lines)


def start(tmp_path: Path, log: Path, *args: str, code: str = PRINTER) -> tuple[JobProcess, Lines]:
    fan, sink = SinkFanout(), Lines()
    fan.add(sink)
    spec = LaunchSpec((sys.executable, "-c", code, *args), str(tmp_path), dict(os.environ), {})
    return JobProcess(spec, fan, None, log, lambda _s: None, OsApi()), sink


def finish(job: JobProcess, stop: Path) -> int:
    stop.write_text("")
    wait_for(lambda: job.poll() is not None, 30, what="the job's exit")
    assert job.pumps_done(10)
    job.close()
    assert job.status is not None
    return os.waitstatus_to_exitcode(job.status)


def test_job_log_follows_logrotate_create_mode(tmp_path: Path) -> None:
    log, stop = tmp_path / "job.log", tmp_path / "stop"
    job, sink = start(tmp_path, log, str(stop))
    wait_for(lambda: log.exists() and log.stat().st_size > 1000, 20, what="lines in job.log")
    log.rename(tmp_path / "job.log.1")  # logrotate (create): rename; the writer must reopen the path
    wait_for(lambda: log.exists() and log.stat().st_size > 100, 20, what="the keeper writing the new job.log")
    assert finish(job, stop) == 0
    old = (tmp_path / "job.log.1").read_text().splitlines()
    new = log.read_text().splitlines()
    assert old and new and new[-1].startswith("last")
    assert old + new == sink.got  # every line once, in order, across the two files


def test_a_symlink_planted_at_the_rotated_path_is_not_followed(tmp_path: Path) -> None:
    log, stop, victim = tmp_path / "job.log", tmp_path / "stop", tmp_path / "victim"
    victim.write_text("precious\n")
    job, sink = start(tmp_path, log, str(stop))
    wait_for(lambda: log.exists() and log.stat().st_size > 1000, 20, what="lines in job.log")
    with capture_logs() as logs:
        log.rename(tmp_path / "job.log.1")
        log.symlink_to(victim)
        wait_for(lambda: any(e["event"] == "job_log_reopen_failed" for e in logs), 20, what="the refusal said")
        assert finish(job, stop) == 0
    assert victim.read_text() == "precious\n"
    assert (tmp_path / "job.log.1").read_text().splitlines() == sink.got  # kept writing the moved file


def test_a_full_disk_under_job_log_neither_hurts_the_job_nor_the_detectors(tmp_path: Path) -> None:
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(tiny)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root to mount a tiny tmpfs (a full disk)")
    try:
        code = "import sys\nfor i in range(20000): print('line', i, flush=True)\n"
        with capture_logs() as logs:
            job, sink = start(tmp_path, tiny / "job.log", code=code)
            wait_for(lambda: job.poll() is not None, 60, what="the job's exit")
            assert job.pumps_done(10)
            job.close()
        assert job.status is not None and os.waitstatus_to_exitcode(job.status) == 0  # no ENOSPC for the job
        assert len(sink.got) == 20000  # the detectors saw every line
        assert [e["event"] for e in logs].count("job_log_write_failed") == 1  # said once
    finally:
        subprocess.run(["umount", "-l", str(tiny)], capture_output=True)


def test_a_keeper_killed_from_outside_is_replaced_and_the_job_lives_on(tmp_path: Path) -> None:
    """kill -9 of the output keeper (issue 24): the daemon holds duplicate read ends, so the job's
    pipes stay open (no EPIPE), a new keeper takes over, and the job's output still reaches
    job.log and the detectors; the job ends with its own exit status."""
    log, stop = tmp_path / "job.log", tmp_path / "stop"
    ended: list[str] = []
    fan, sink = SinkFanout(), Lines()
    fan.add(sink)
    spec = LaunchSpec((sys.executable, "-c", PRINTER, str(stop)), str(tmp_path), dict(os.environ), {})
    with capture_logs() as logs:
        job = JobProcess(spec, fan, None, log, ended.append, OsApi())
        wait_for(lambda: log.exists() and log.stat().st_size > 100, 20, what="lines in job.log")
        first = job.keeper.pid
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: job.keeper.pid != first, 20, what="a new keeper")
        size = log.stat().st_size
        wait_for(lambda: log.stat().st_size > size + 100, 20, what="lines after the kill in job.log")
        assert job.poll() is None and ended == []
        assert finish(job, stop) == 0
    assert sorted(ended) == ["stderr", "stdout"]
    assert any(e["event"] == "output_keeper_restarted" for e in logs)
    assert not any(e["event"] == "output_keeper_lost" for e in logs)
    text = log.read_text()
    assert "last" in text and any(line.startswith("last") for line in sink.got)


def test_a_keeper_that_keeps_dying_is_reported_and_both_streams_end(tmp_path: Path) -> None:
    log, stop = tmp_path / "job.log", tmp_path / "stop"
    ended: list[str] = []
    fan = SinkFanout()
    spec = LaunchSpec((sys.executable, "-c", PRINTER, str(stop)), str(tmp_path), dict(os.environ), {})
    with capture_logs() as logs:
        job = JobProcess(spec, fan, None, log, ended.append, OsApi())
        for _ in range(MAX_KEEPER_RESPAWNS + 1):
            pid = job.keeper.pid
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: job.keeper.pid != pid or job.link.ended, 20, what="a new keeper or the give-up")
        assert job.pumps_done(10)  # the runner is never left waiting for the output
    assert sorted(ended) == ["stderr", "stdout"]
    assert any(e["event"] == "output_keeper_lost" for e in logs)
    os.killpg(job.pgid, signal.SIGKILL)
    wait_for(lambda: job.poll() is not None, 10, what="the job's exit")
    job.close()
