"""The one write path of an attempt's ledger fields (supervisor/daemon/effects.py): a concern hands
an AttemptField to the daemon; the main loop writes it, once, in the order handed over, whichever
thread handed it over; and what status shows of the remedies in force is the machine's one value."""
from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from supervisor.daemon.effects import AttemptField, AttemptWriter

from ..fakes import FakeLedger, close_all, config, daemon



def test_an_attempt_field_sets_only_the_columns_given() -> None:
    assert AttemptField(3).columns() == {}
    assert AttemptField(3, resume_step=0, validation={"passed": True}).columns() == {
        "resume_step": 0, "validation_json": {"passed": True}}
    with pytest.raises(AttributeError):  # a value that flows between threads: frozen
        AttemptField(3).resume_step = 5  # type: ignore[misc]


def test_the_writer_writes_a_field_into_its_attempts_row() -> None:
    led = FakeLedger()
    led.begin_attempt("run-1", 0, ["python"], "/", {}, None, None, None, [], None)
    writer = AttemptWriter(led, lambda: "run-1")
    writer.write(AttemptField(0, resume_step=7))
    assert [(a, f) for a, f, _t in led.updates] == [(0, {"resume_step": 7})]


def test_on_the_loop_thread_an_effect_is_carried_out_at_once_without_waking_the_loop(tmp_path: Path) -> None:
    d = daemon(tmp_path)
    before = len(d.ledger.updates)
    d.runner.apply(AttemptField(d.runner.attempt, resume_step=7))  # the test's thread runs the loop
    assert [f for _a, f, _t in d.ledger.updates[before:]] == [{"resume_step": 7}] and d.runner.inbox.get() is None


def test_fields_from_another_thread_are_messages_the_loop_writes_once_in_order(tmp_path: Path) -> None:
    d = daemon(tmp_path)
    attempt = d.runner.attempt
    before = len(d.ledger.updates)
    steps = [5, 6, 7]

    def verifier() -> None:  # as a checkpoint verifier thread does
        for s in steps:
            d.runner.apply(AttemptField(attempt, resume_step=s))

    t = threading.Thread(target=verifier)
    t.start()
    t.join()
    assert len(d.ledger.updates) == before, "another thread wrote the ledger itself"
    d.step()  # the loop's next turn writes what was handed over
    mine = [(a, f["resume_step"], th) for a, f, th in d.ledger.updates[before:] if "resume_step" in f]
    assert [(a, s) for a, s, _th in mine] == [(attempt, s) for s in steps]
    assert {th for _a, _s, th in mine} == {threading.get_ident()}  # written on the loop's thread
    d.step(2)
    assert len([u for u in d.ledger.updates[before:] if "resume_step" in u[1]]) == 3  # once each
    assert d.ledger.rows[attempt]["resume_step"] == 7


def test_a_field_handed_over_just_before_the_daemon_exits_is_still_written(tmp_path: Path) -> None:
    d = daemon(tmp_path)
    attempt = d.runner.attempt
    t = threading.Thread(target=lambda: d.runner.apply(AttemptField(attempt, resume_step=42)))
    t.start()
    t.join()
    close_all()  # no turn of the loop in between: close drains what was handed over
    assert d.ledger.rows[attempt]["resume_step"] == 42 and d.ledger.closed


def test_status_shows_the_scale_of_the_remedies_in_force_as_the_relaunch_gets_it(tmp_path: Path) -> None:
    """A repeated crash climbs its ladder to a scale remedy: the relaunched job's --lr is halved,
    and status's remedies (the machine's RemediesInForce, as_status) show the scale too."""
    cfg = config(tmp_path, job={"command": ["python", "train.py", "--lr=0.001"]},
                 policy={"healthy_after_s": 600.0},
                 on={"crash": {"remedies": [{"scale": {"--lr": 0.5}}]}})
    d = daemon(tmp_path, cfg)
    for _ in range(2):
        d.launcher.job.exits(1)
        d.step(2)
        d.clock.advance(60.0)
        d.settle()
    st = d.runner.control("status", {})
    assert st["remedies"] == {"env": {}, "args": [], "skip_batches": 0, "scale": {"--lr": 0.5}}, json.dumps(st)
    assert st["remedies"] == d.runner.machine.remedies.as_status()
    assert "--lr=0.0005" in d.launcher.specs[-1].argv
