"""A checkpoint request never harms the run (issue 34): the job's signal disposition read from
/proc of real children (a handler, none, SIG_IGN), the refusal's reasons, and an exit by the
supervisor's own signal told as such and not taken as a deterministic crash."""
from __future__ import annotations

import signal
import subprocess
import sys
from typing import Iterator

import pytest

from supervisor.core.messages import ExitInfo
from supervisor.core.policy import BY_SUPERVISOR, PastAttempt, RepeatKey, _identical_repeat
from supervisor.daemon.ckptsignal import blame_supervisor_signal, disposition, send_checkpoint_signal, why_not
from supervisor.events import Cause

HANDLER = "import signal, time; signal.signal(signal.SIGUSR1, lambda *a: None); print('ready', flush=True); time.sleep(60)"
NO_HANDLER = "import time; print('ready', flush=True); time.sleep(60)"
IGNORED = "import signal, time; signal.signal(signal.SIGUSR1, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"


@pytest.fixture
def child() -> Iterator:
    started: list[subprocess.Popen] = []

    def start(code: str) -> int:
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        started.append(p)
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"  # its handler is in place
        return p.pid

    yield start
    for p in started:
        p.kill()
        p.wait(10)


def test_disposition_reads_the_kernel_s_view_of_a_real_child(child) -> None:
    assert disposition(child(HANDLER), signal.SIGUSR1) == "caught"
    assert disposition(child(NO_HANDLER), signal.SIGUSR1) == "default"
    assert disposition(child(IGNORED), signal.SIGUSR1) == "ignored"
    assert disposition(2 ** 23, signal.SIGUSR1) is None  # above any pid_max: /proc says nothing


def test_the_signal_is_sent_only_when_no_process_of_the_job_would_die_of_it(child) -> None:
    caught, default, ignored = child(HANDLER), child(NO_HANDLER), child(IGNORED)
    assert why_not([caught], signal.SIGUSR1, client_seen=False) is None
    assert why_not([caught, ignored], signal.SIGUSR1, client_seen=False) is None
    reason = why_not([caught, default], signal.SIGUSR1, client_seen=True)  # the client does not overrule /proc
    assert reason is not None and f"process {default}" in reason and "does not handle SIGUSR1" in reason
    assert "ignores SIGUSR1" in (why_not([ignored], signal.SIGUSR1, client_seen=False) or "")
    # /proc silent (another pid namespace): our client's heartbeat is the evidence
    assert why_not([2 ** 23], signal.SIGUSR1, client_seen=True) is None
    assert "not known to handle SIGUSR1" in (why_not([2 ** 23], signal.SIGUSR1, client_seen=False) or "")
    assert why_not([default], signal.SIGCONT, client_seen=False) is None  # harmless by default


class _Job:
    def __init__(self) -> None:
        self.signals: list[int] = []

    def signal_group(self, sig: int) -> None:
        self.signals.append(sig)


def test_a_death_by_the_supervisor_s_own_signal_is_not_the_job_s_deterministic_crash() -> None:
    job, killed = _Job(), ExitInfo(None, "SIGUSR1", Cause.CRASH, "killed by SIGUSR1")
    assert blame_supervisor_signal(killed, job) is killed  # nothing sent: the job's own
    send_checkpoint_signal(job, signal.SIGUSR1)
    assert job.signals == [signal.SIGUSR1]
    info = blame_supervisor_signal(killed, job)
    assert info.signal == "SIGUSR1" + BY_SUPERVISOR and "the supervisor's signal ended it" in info.summary
    other = ExitInfo(None, "SIGSEGV", Cause.CRASH, "killed by SIGSEGV")
    assert blame_supervisor_signal(other, job) is other
    key = RepeatKey(None, None, "L", 152, info.signal or "")
    prev = PastAttempt(0, Cause.CRASH, 0.0, 10.0, True, False, key)
    assert _identical_repeat([prev], Cause.CRASH, key, 0) is None  # no give-up as "deterministic"
    plain = RepeatKey(None, None, "L", 152, "SIGUSR1")
    assert _identical_repeat([PastAttempt(0, Cause.CRASH, 0.0, 10.0, True, False, plain)], Cause.CRASH, plain, 0)
