"""A real process standing in for a fake job's, so that the daemon reads its checkpoint-signal
disposition from /proc (issue 34: SIGUSR1 goes only to a job that handles it)."""
from __future__ import annotations

import contextlib
import subprocess
import sys
from typing import Any, Iterator


@contextlib.contextmanager
def real_job_process(job: Any, handles: bool = True) -> Iterator[subprocess.Popen]:
    """``job.pids()`` made a real Python process's, with a SIGUSR1 handler or none; killed after."""
    code = ("import signal, time; " + ("signal.signal(signal.SIGUSR1, lambda *a: None); " if handles else "")
            + "print('ready', flush=True); time.sleep(120)")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"  # the handler is in place
        job.pids = lambda: [p.pid]
        yield p
    finally:
        p.kill()
        p.wait(10)
