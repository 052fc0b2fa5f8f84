"""The ledger's run states are the machine's: every state a daemon life ends in either ends the
run (the next daemon starts a new one) or interrupts it (the next daemon continues it)."""
from __future__ import annotations

from supervisor.core.machine import JOB_UP, MOVES, State
from supervisor.ledger.runstates import FINAL_STATES, IN_PROGRESS, INTERRUPTED, TERMINAL


def test_every_terminal_state_either_ends_the_run_or_interrupts_it() -> None:
    ends = {s for s in State if not MOVES[s]}
    assert ends == set(TERMINAL) and ends, "a state with no move out is where a daemon life ends"
    for s in ends:
        assert (s.value in FINAL_STATES) != (s in INTERRUPTED), f"{s} must either end the run or interrupt it"
    assert INTERRUPTED <= ends


def test_only_terminal_states_are_final_and_a_live_run_is_not() -> None:
    assert FINAL_STATES == {"finished", "gave_up"}  # SPEC: exit 0 (job done) and 3 (gave up) end the run
    for s in State:
        if MOVES[s] or s in JOB_UP:
            assert s.value not in FINAL_STATES, f"{s} has moves out: the run goes on"
    assert IN_PROGRESS == State.RUNNING.value and IN_PROGRESS not in FINAL_STATES
