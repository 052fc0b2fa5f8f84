"""The end's weights check (supervisor/daemon/endweights.py) on real checkpoints with the job's
Python, and the words of the end (supervisor/core/runend.py): nothing is called checked that was not."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from supervisor.checkpoints.config import CheckpointsConfig
from supervisor.checkpoints.loadtest import LoadTestResult
from supervisor.checkpoints.service import CheckpointService
from supervisor.core.runend import EndFacts, SourceSeen, Verdict, WeightsCheck, end_verdict
from supervisor.daemon.endweights import check_newest_weights, weights_of


def test_the_newest_checkpoint_is_checked_finite_with_the_jobs_python_and_the_watchdog_fed(tmp_path: Path):
    (tmp_path / "state").mkdir()
    (tmp_path / "ck").mkdir()
    svc = CheckpointService(CheckpointsConfig(settle_s=30.0), tmp_path / "ck", tmp_path / "state", sys.executable,
                            ["python", "train.py"], tmp_path)
    pinged: list[int] = []

    def ping() -> bool:  # the watchdog fed; True: go on
        pinged.append(1)
        return True
    assert check_newest_weights(svc, ping) == WeightsCheck(
        None, None, note=f"no complete checkpoint in {tmp_path / 'ck'}")
    torch.save({"w": torch.ones(3), "b": torch.zeros(2)}, tmp_path / "ck" / "step_10.pt")
    bad = {"w": torch.full((3,), float("nan")), "b": torch.zeros(2), "v": torch.tensor([float("inf")])}
    torch.save(bad, tmp_path / "ck" / "step_20.pt")  # just written: the job is gone, so settled
    got = check_newest_weights(svc, ping)
    assert got.checkpoint == str(tmp_path / "ck" / "step_20.pt") and got.finite is False
    assert sorted(got.nonfinite) == ["v", "w"] and pinged
    # A stop asked for during the check: given up at once, said as not done (never "finite").
    torch.save(bad, tmp_path / "ck" / "step_30.pt")
    stopped = check_newest_weights(svc, lambda: False)
    assert stopped.finite is None and stopped.note == "the supervisor was asked to stop before the check ended"
    (tmp_path / "ck" / "step_30.pt").unlink()
    (tmp_path / "ck" / "step_20.pt").unlink()
    assert check_newest_weights(svc, lambda: True) == WeightsCheck(str(tmp_path / "ck" / "step_10.pt"), True)
    svc.close()
    off = CheckpointService(CheckpointsConfig(settle_s=30.0, load_test=False), tmp_path / "ck", tmp_path / "state",
                            sys.executable, ["python", "train.py"], tmp_path)
    w = check_newest_weights(off, lambda: True)  # as a rollback's check: none without load tests
    assert w.finite is None and "load_test = false" in w.note
    off.close()
    torch.save(bad, tmp_path / "ck" / "step_40.pt")
    skip = CheckpointService(CheckpointsConfig(settle_s=30.0, check_at_end=False), tmp_path / "ck",
                             tmp_path / "state", sys.executable, ["python", "train.py"], tmp_path)
    w = check_newest_weights(skip, lambda: True)  # turned off: never called finite, the end says why
    assert w.finite is None and w.checkpoint == str(tmp_path / "ck" / "step_40.pt") and "check_at_end = false" in w.note
    skip.close()


def test_a_check_that_could_not_judge_is_said_as_not_done():
    failed = LoadTestResult(False, 1.0, "UnpicklingError: truncated")
    assert weights_of("/c/x.pt", failed) == WeightsCheck("/c/x.pt", None, note="the load test of /c/x.pt failed: "
                                                                             "UnpicklingError: truncated")
    dcp = LoadTestResult(True, 1.0, None, notes=("finite check not done for DCP folders (would need the full "
                                                   "model to load into)",))
    w = weights_of("/c/step_5", dcp)
    assert w.finite is None and "finite check not done for DCP folders" in w.note
    v = end_verdict(EndFacts(sources=(SourceSeen("stdout", ("hf",), 3, 30, 100.0),), weights=w), attempt=1,
                    ran_s=60.0, wall=104.0)
    assert v.verdict is Verdict.WATCHED and not v.gave_up and "weights not checked: /c/step_5: finite check not" \
        in v.reason and "finite:" not in v.reason and "last step 30, 4.0 s before the end" in v.reason


def test_the_end_events_reach_the_journal_with_their_verdict_and_weights_as_fields():
    """What the recorder logs for the end (the machine's records) as journald gets it."""
    from pathlib import Path as P

    from supervisor.config.model import config_from_table
    from supervisor.core.machine import Machine
    from supervisor.core.messages import (Boot, CheckEnd, EndChecked, ExitInfo, JobExited, Prepared, Record, Resume,
                                          Spawned)
    from supervisor.eventids import MESSAGE_IDS
    from supervisor.eventnames import EventName
    from supervisor.ops.journal import entry_fields

    m = Machine(config_from_table({"job": {"command": ["python", "t.py"]}}), P("/state"))
    m.handle(Boot())
    m.handle(Prepared(resume=Resume(None, None, "fresh")))
    m.handle(Spawned(10, 10, ["python", "t.py"], 0.0))
    (ask,) = [c for c in m.handle(JobExited(ExitInfo(0, None, None, "exited 0"), False, 9.0, 109.0))
              if isinstance(c, CheckEnd)]
    nan = WeightsCheck("/ck/step_9.pt", False, ("w",))
    records = [c for c in m.handle(EndChecked(EndFacts(weights=nan), ask)) if isinstance(c, Record)]
    by = {r.event: r for r in records}
    for name, verdict in ((EventName.RUN_UNWATCHED, "nonfinite_weights"),
                          (EventName.CHECKPOINT_NONFINITE_AT_END, "nonfinite_weights")):
        r = by[name]
        f = entry_fields({"event": r.event, "level": r.level, **r.data}, r.message)
        assert f["MESSAGE_ID"] == MESSAGE_IDS[name] and f["TSUP_VERDICT"] == verdict
        assert '"finite":false' in f["TSUP_WEIGHTS"] and f["TSUP_SOURCES"] == "[]"
    assert by[EventName.CHECKPOINT_NONFINITE_AT_END].message.startswith(
        "finished with non-finite weights in /ck/step_9.pt: 1 tensor(s) hold NaN/Inf (w)")
    assert by[EventName.RUN_UNWATCHED].message.startswith("finished, unwatched: the job exited 0 after 9.0 s")


def test_the_wait_feeds_the_watchdog_and_stops_for_a_stop_signal_left_queued_in_order() -> None:
    import signal

    from supervisor.daemon.inbox import Inbox, SignalArrived, WakeUp
    from supervisor.daemon.requests import go_on

    class Watchdog:
        fed = 0

        def watchdog(self) -> bool:
            self.fed += 1
            return True

    inbox = Inbox()
    dog = Watchdog()
    keep = go_on(inbox, dog)  # type: ignore[arg-type]
    inbox.put(WakeUp())
    inbox.put(SignalArrived(signal.SIGHUP))
    assert keep() and dog.fed == 1
    inbox.put(SignalArrived(signal.SIGTERM))
    assert not keep() and dog.fed == 2
    left = inbox.take_all()
    assert left == [WakeUp(), SignalArrived(signal.SIGHUP), SignalArrived(signal.SIGTERM)] and inbox.get() is None
