"""The real launcher port's exit classification (supervisor/daemon/adapters.py): a real job that
leaves torchrun's error file gets its root cause in the exit; a job that is no JobProcess, a
clean exit, or a look without evidence gets none."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from supervisor.core.causes import Cause
from supervisor.daemon.adapters import ProcessLauncher
from supervisor.job import torchelastic
from supervisor.job.osapi import OsApi
from supervisor.job.output import SinkFanout
from supervisor.job.process import JobProcess, LaunchSpec

from ..fakes import FakeJob
from ..util import wait_for

ERROR = {"message": {"message": "ValueError: boom at step 3", "errorCode": 1,
                     "extraInfo": {"timestamp": "1700000000",
                                   "py_callstack": 'Traceback (most recent call last):\n'
                                                   '  File "train.py", line 12, in main\n'
                                                   '    raise ValueError("boom at step 3")\n'}}}


def ended_job(tmp_path: Path, code: int) -> JobProcess:
    """A real job (no cgroup, the test process untouched) that writes its error file and exits ``code``."""
    err = tmp_path / f"error-{code}.json"
    script = f"import json, sys; json.dump({ERROR!r}, open({str(err)!r}, 'w')); sys.exit({code})"
    env = {**os.environ, torchelastic.ENV: str(err)}
    spec = LaunchSpec((sys.executable, "-c", script), str(tmp_path), env, {torchelastic.ENV: str(err)}, cgroup=False)
    job = JobProcess(spec, SinkFanout(), None, tmp_path / "job.log", lambda _s: None, OsApi())
    wait_for(lambda: job.poll() is not None, 60, what="the job's exit")
    return job


def test_a_failed_job_s_exit_carries_the_root_cause_it_left(tmp_path: Path) -> None:
    launcher = ProcessLauncher(SinkFanout(), None, OsApi())
    job = ended_job(tmp_path, 1)
    try:
        info = launcher.exit_info(job, evidence=True)
        assert info.cause is Cause.CRASH and info.root_cause is not None, info
        assert info.root_cause["exception"] == "ValueError" and info.root_cause["message"] == "boom at step 3"
        assert info.root_cause["last_frame"] == "train.py:12 in main"
        assert info.summary.endswith("raised ValueError: boom at step 3 (at train.py:12 in main)"), info.summary
        assert launcher.exit_info(job, evidence=False).root_cause is None  # a quick look reads no files
    finally:
        job.close()
        launcher.close()


def test_a_clean_exit_and_a_job_without_a_spec_get_no_root_cause(tmp_path: Path) -> None:
    launcher = ProcessLauncher(SinkFanout(), None, OsApi())
    job = ended_job(tmp_path, 0)
    try:
        info = launcher.exit_info(job, evidence=True)
        assert info.cause is None and info.root_cause is None  # the file is there; nothing failed
    finally:
        job.close()
    fake = FakeJob(4242)
    fake.status = 1 << 8  # exit 1, as wait() reports it
    info = launcher.exit_info(fake, evidence=True)  # not a JobProcess: no error file to look for
    assert info.cause is Cause.CRASH and info.root_cause is None
    launcher.close()
