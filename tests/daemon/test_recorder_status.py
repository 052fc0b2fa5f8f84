"""The runner's event recording (supervisor/daemon/recorder.py) and its status cache
(supervisor/daemon/status.py StatusCache) on their own: a fake ledger, recording concerns."""
from __future__ import annotations

from typing import Any, Mapping

from structlog.testing import capture_logs

from supervisor.daemon.plugin import ConcernSet, Effects, Noted, OnNotes
from supervisor.daemon.recorder import EventRecorder
from supervisor.daemon.status import StatusCache

from ..fakes import FakeLedger


class Heard(OnNotes):
    name = "heard"

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str, Mapping[str, Any]]] = []

    def noted(self, n: Noted) -> Effects:
        self.events.append((n.event, n.level, n.message, n.data))
        return ()


def test_an_event_is_logged_kept_in_the_ledger_and_told_to_every_concern() -> None:
    ledger, heard = FakeLedger(), Heard()
    where: list[Any] = ["run-1", -1]
    rec = EventRecorder(ledger, ConcernSet([heard]), lambda: (str(where[0]), int(where[1])))
    with capture_logs() as logs:
        rec.event("daemon_started", "info", "supervising", pid=7, skipped=None)
        where[1] = 2
        rec.event("checkpoint_chosen", "info", "resuming", ledger_only=True, path="/c/1")
    assert [(e["event"], e["attempt"]) for e in ledger.events] == [("daemon_started", None), ("checkpoint_chosen", 2)]
    assert ledger.events[0]["data"] == {"pid": 7, "skipped": None}  # the ledger keeps what the log line drops
    assert [(e["event"], e.get("attempt"), "skipped" in e) for e in logs] == [("daemon_started", None, False)]
    assert [e[0] for e in heard.events] == ["daemon_started", "checkpoint_chosen"]


def test_a_name_outside_the_vocabulary_is_recorded_and_said_once() -> None:
    ledger = FakeLedger()
    rec = EventRecorder(ledger, ConcernSet([]), lambda: ("run-1", 0))
    with capture_logs():
        for _ in range(2):
            rec.event("no_such_event_name", "warning", "x")
    assert [e["event"] for e in ledger.events] == ["event_name_unknown", "no_such_event_name", "no_such_event_name"]


def test_a_level_is_a_member_and_its_spelling_reads_the_same_a_misspelt_one_fails() -> None:
    """The event path takes a Level (supervisor/levels.py); the plain strings the plug-ins still
    pass are read as one, and the log line, ledger row and concerns see the same level."""
    import pytest

    from supervisor.levels import Level

    ledger, heard = FakeLedger(), Heard()
    rec = EventRecorder(ledger, ConcernSet([heard]), lambda: ("run-1", 0))
    with capture_logs() as logs:
        rec.event("gave_up", Level.CRITICAL, "x")
        rec.event("job_started", "debug", "y")
        with pytest.raises(ValueError, match="'warn' is not a valid Level"):
            rec.event("job_started", "warn", "z")
    assert [e["log_level"] for e in logs] == ["critical", "debug"]
    assert [e["level"] for e in ledger.events] == ["critical", "debug"] == [h[1] for h in heard.events]


def test_status_is_built_until_cached_then_the_cache_under_what_threads_set_since() -> None:
    built: list[int] = []
    live: dict[str, Any] = {}

    def build() -> dict[str, Any]:
        built.append(1)
        return {"state": "running", "n": len(built), "warning": None}

    cache = StatusCache(build, lambda: dict(live))
    cache.refresh_if_used()  # nothing served from the cache yet: nothing built
    assert built == [] and cache.answer()["n"] == 1 and cache.snapshot == {}
    assert cache.refresh()["n"] == 2
    live["warning"] = "not kept"
    assert cache.answer() == {"state": "running", "n": 2, "warning": "not kept"} and len(built) == 2
    cache.refresh_if_used()  # a state change: at once
    assert cache.snapshot["n"] == 3


def test_a_status_part_failing_after_a_change_keeps_the_last_snapshot_and_says_so() -> None:
    fail = [False]

    def build() -> dict[str, Any]:
        if fail[0]:
            raise OSError("proc unreadable")
        return {"state": "running"}

    cache = StatusCache(build, dict)
    cache.refresh()
    fail[0] = True
    with capture_logs() as logs:
        cache.refresh_if_used()
    assert cache.answer() == {"state": "running"}
    (failed,) = [e for e in logs if e["event"] == "status_refresh_failed"]
    assert "OSError" in failed["error"] and "the next tick retries" in failed["message"]


def test_the_launch_steps_show_as_starting_with_their_phase(tmp_path) -> None:
    """SPEC's `state` names the launch "starting"; the machine's finer steps are in `phase`."""
    from supervisor.cli.render import status_table
    from supervisor.core.machine import Machine, State
    from supervisor.daemon.status import status_dict

    from ..fakes import config

    cfg = config(tmp_path)
    m = Machine(cfg, tmp_path / "state")
    assert m.state is State.PREPARING  # the first launch is being prepared (gate, checkpoint choice)
    st = status_dict(m, run_id="r", cfg=cfg, state_dir=tmp_path, pids=[], last_metric=None,
                     restart_in_s=None, extras=[])
    assert (st["state"], st["phase"]) == ("starting", "preparing") and st["pids"] == []
    assert "starting (preparing)" in status_table(st)
    m.state = State.RUNNING
    st = status_dict(m, run_id="r", cfg=cfg, state_dir=tmp_path, pids=[7], last_metric=None,
                     restart_in_s=None, extras=[])
    assert (st["state"], st["phase"]) == ("running", "running") and "(running)" not in status_table(st)
