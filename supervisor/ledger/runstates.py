"""The states a run has in the ledger (``runs.state``), derived from the machine's
:class:`~supervisor.core.machine.State`, never typed again.

A run row says ``running`` while a daemon supervises it, and the machine's final state once a
daemon life ends. Not every end of a daemon life ends the run: after a stop (the ``stop`` verb,
SIGTERM from systemd, a Slurm time limit or preemption, a pod eviction: exit 0 or 143) the next
daemon on the same state dir continues the same run (the requeue path, docs/operating.md).
"""

from __future__ import annotations

from ..core.machine import MOVES, State

#: The machine's states with no move out of them: a daemon life ends in one.
TERMINAL: frozenset[State] = frozenset(s for s, after in MOVES.items() if not after)

#: Terminal states that interrupt the run instead of ending it: the next daemon continues it.
INTERRUPTED: frozenset[State] = frozenset({State.STOPPED})

#: The ``runs.state`` values that end a run for good: the next daemon starts a new run. Any
#: other value (``running`` of a daemon killed with -9, ``stopped``) means the run continues.
FINAL_STATES: frozenset[str] = frozenset(s.value for s in TERMINAL - INTERRUPTED)

#: The ``runs.state`` of a run a daemon supervises (and of one whose daemon died).
IN_PROGRESS: str = State.RUNNING.value
