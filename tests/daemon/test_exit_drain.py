"""The decision on an exit waits for the attempt's last metric records (found by the issue 12
soak: about one restart in 60 got a 10 s backoff although the attempt had printed a new step)."""
from __future__ import annotations

import json
from pathlib import Path

from supervisor.daemon.jobstop import EXIT_DRAIN_S
from supervisor.job.catchup import OutputLag

from ..fakes import daemon


def test_a_step_printed_just_before_the_exit_counts_as_progress(tmp_path: Path) -> None:
    d = daemon(tmp_path)
    job = d.launcher.job
    fed: list[bool] = []

    def pumps_done(timeout: float = 0.0) -> bool:
        # The job's last line reaches the parser while the loop checks the exit: after this
        # turn's metric drain, before the decision.
        if not fed:
            fed.append(True)
            assert d.watch.logwatch is not None
            d.watch.logwatch.feed("stdout", [json.dumps({"step": 7, "loss": 2.0})])
        return True

    job.pumps_done = pumps_done  # type: ignore[method-assign]
    job.exits(1)
    d.step(3)
    scheduled = d.ledger.named("restart_scheduled")
    assert scheduled, d.events()
    assert scheduled[-1]["data"]["delay_s"] == 0.0, scheduled[-1]["data"]["delay_reason"]
    assert d.ledger.rows[0]["detection"]["step"] == 7
    assert [r["attempt"] for r in d.ledger.metric_rows] == [0]  # kept under its own attempt


def test_the_exit_waits_for_output_printed_before_it_that_the_parsers_are_still_reading(tmp_path: Path) -> None:
    """A burst the keeper left in job.log for the parsers (issue 25 build 7): the exit is not taken
    as final after the usual 1 s while output printed before it is still being parsed; a
    straggler's output after the exit (not draining) is waited for 1 s only, as before."""
    d = daemon(tmp_path)
    job = d.launcher.job
    lag = [OutputLag(seconds=30.0, bytes=4096, max_seconds=30.0, draining=True)]
    job.pumps_done = lambda timeout=0.0: False  # type: ignore[method-assign]
    job.output_lag = lambda: lag[0]  # type: ignore[method-assign]
    assert d.runner.status()["output_lag"] == {"seconds": 30.0, "bytes": 4096, "max_seconds": 30.0,
                                               "unparsed_bytes": 0}
    job.exits(0)
    for _ in range(3):
        d.clock.advance(EXIT_DRAIN_S * 5)
        d.step(2)
    assert d.runner.state.value == "starting", d.events()  # the exit is not decided on yet
    lag[0] = OutputLag(seconds=0.5, max_seconds=30.0, draining=False)  # caught up; only a straggler's output left
    d.clock.advance(EXIT_DRAIN_S)
    d.step(3)
    assert d.runner.state.value == "finished", d.events()


def test_a_detection_queued_behind_a_flood_at_the_exit_is_judged_before_the_end(tmp_path: Path) -> None:
    """The exit is decided only once the inbox is empty: a NaN queued behind more than a turn's
    share of messages (1,000 a drain) is the attempt's end, not a clean "finished"."""
    import time

    from supervisor.core.causes import Cause
    from supervisor.core.observations import Detection
    from supervisor.daemon.inbox import DetectionArrived, WakeUp

    d = daemon(tmp_path)
    for _ in range(2500):
        d.runner.inbox.put(WakeUp())
    d.runner.inbox.put(DetectionArrived(Detection(Cause.NAN, "loss is nan at step 9", "stdout", step=9,
                                                  at=time.time())))
    d.launcher.job.exits(0)
    d.step(4)
    assert d.runner.state.value != "finished", d.events()
    assert d.ledger.named("failure_detected"), d.events()
