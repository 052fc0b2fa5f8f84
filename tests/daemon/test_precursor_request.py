"""The precursor watch's action, fast (issue 38 part 6): a grad-norm ramp in the job's output
makes the daemon send the job its checkpoint signal, once, with the reason as an event; a healthy
run's noise sends nothing. The real runner and log watcher on fakes; the slow e2e
(tests/e2e/test_precursor_e2e.py) shows the rollback landing near the onset."""
from __future__ import annotations

import signal
from pathlib import Path
from typing import Iterator

import pytest

from supervisor.daemon.precursors import PrecursorPlugin
from tests.fakes import Daemon, close_all, config, daemon, step_line
from tests.helpers.sigjob import real_job_process


@pytest.fixture
def watched(tmp_path: Path) -> Iterator[tuple[Daemon, PrecursorPlugin]]:
    concern = PrecursorPlugin()
    cfg = config(tmp_path, detectors={"precursor": {"warmup_steps": 20, "min_points": 10}})
    d = daemon(tmp_path, cfg, concerns=[concern])
    try:
        yield d, concern
    finally:
        close_all()


def _steps(d: Daemon, grads: list[float], first: int) -> None:
    for i, g in enumerate(grads):
        d.lines(step_line(first + i, 2.0 - 0.001 * i, g))
    d.step(3)  # the metrics reach the concerns, and the request the loop


def test_a_grad_norm_ramp_sends_the_job_its_checkpoint_signal_once(watched: tuple[Daemon, PrecursorPlugin]):
    d, concern = watched
    job = d.launcher.job
    with real_job_process(job):
        _body_handled(d, concern, job)


def _body_handled(d: Daemon, concern: PrecursorPlugin, job) -> None:
    _steps(d, [1.0 + 0.01 * (s % 7) for s in range(60)], 1)
    assert job.signals == [] and concern.status(d.runner.run_view()) == {"precursor_checkpoints": 0}
    _steps(d, [2.0 ** k for k in range(1, 9)], 61)  # the ramp before a divergence
    assert job.signals.count(signal.SIGUSR1) == 1, job.signals  # checkpoint-now, rate-limited to one
    assert concern.status(d.runner.run_view()) == {"precursor_checkpoints": 1}
    [ev] = d.ledger.named("divergence_precursor")
    assert "asking the job for a checkpoint now" in ev["message"] and ev["data"]["kind"] == "grad_norm_ramp"
    assert d.ledger.named("checkpoint_request_not_sent") == []


def test_a_job_without_a_handler_is_not_sent_the_signal_and_the_event_says_why(
        watched: tuple[Daemon, PrecursorPlugin]):
    d, _ = watched
    job = d.launcher.job
    with real_job_process(job, handles=False) as proc:
        _steps(d, [1.0 + 0.01 * (s % 7) for s in range(60)], 1)
        _steps(d, [2.0 ** k for k in range(1, 9)], 61)
        assert signal.SIGUSR1 not in job.signals, job.signals  # its default action would end the job
        [ev] = d.ledger.named("checkpoint_request_not_sent")
        assert "does not handle SIGUSR1" in ev["message"] and "client" in ev["message"]
        assert proc.poll() is None
