"""The decision on an exit waits for the attempt's last metric records (found by the issue 12
soak: about one restart in 60 got a 10 s backoff although the attempt had printed a new step)."""
from __future__ import annotations

import json
from pathlib import Path

from ..fakes import close_all, daemon


def teardown_function() -> None:
    close_all()


def test_a_step_printed_just_before_the_exit_counts_as_progress(tmp_path: Path) -> None:
    d = daemon(tmp_path)
    job = d.launcher.job
    fed: list[bool] = []

    def pumps_done(timeout: float = 0.0) -> bool:
        # The job's last line reaches the parser while the loop checks the exit: after this
        # turn's metric drain, before the decision.
        if not fed:
            fed.append(True)
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
