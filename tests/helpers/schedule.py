"""The order the parallel suite runs in: the heavy tests first on every worker, the run's tail short.

pytest-xdist's work-stealing scheduler hands worker i the i-th contiguous slice of the collection
(equal counts), and an idle worker steals the last half of the busiest one's queue. In collection
order the heavy end-to-end suites sat in one or two slices and were still running, stolen or not,
when the other workers had finished: a tail of one or two workers on a 2-core machine. So the
collection is rearranged into slices of exactly the counts xdist will cut, each with an equal share
of the heavy modules, those first (the longest first), the light tests after them (what a steal
takes, from the end). A module with a heavy test moves whole: its module-scoped fixtures (a trained
run, a built wheel) are set up once, on one worker.

The cost of a test is how long it keeps its worker busy: its wall seconds in the last recorded run
(``tests/durations.tsv``, a ``TSUP_TEST_CPU`` output: ``cpu wall worker start end nodeid``), its
CPU seconds where a line has only ``cpu nodeid``; a test not in it is guessed from its marks. Wall,
not CPU: a test that mostly waits (the real slurm test: 47 s of requeue, 0.7 CPU-s) was ordered
as light, last in its slice, and ran alone for the run's last 30 s while the other workers had
finished. With more workers than cores the CPU is shared by whatever runs; what the slices must
balance is how long each worker is occupied.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

HEAVY_S = 2.0  # a module with a test this long is placed as a whole, first in its slice
GUESS_SLOW_S = 10.0  # a new test marked slow or systemd, until the file knows it
GUESS_S = 0.2  # a new test without those marks


@dataclass(frozen=True)
class Test:
    nodeid: str
    cost: float  # seconds the test keeps a worker busy, recorded or guessed


def read_costs(path: Path) -> dict[str, float]:
    """``cpu<TAB>wall<TAB>...<TAB>nodeid`` lines (a TSUP_TEST_CPU file): the wall seconds;
    ``cpu<TAB>nodeid`` lines: the CPU seconds. A missing file or a bad line is no cost known,
    never an error: this only orders the run."""
    costs: dict[str, float] = {}
    try:
        text = path.read_text()
    except OSError:
        return costs
    for line in text.splitlines():
        parts = line.split("\t")
        try:
            costs[parts[-1]] = float(parts[1] if len(parts) > 2 else parts[0])
        except (ValueError, IndexError):
            continue
    return costs


def guess(nodeid: str, marks: set[str], costs: dict[str, float]) -> float:
    if nodeid in costs:
        return costs[nodeid]
    return GUESS_SLOW_S if marks & {"slow", "systemd"} else GUESS_S


def slice_counts(total: int, workers: int) -> list[int]:
    """The counts xdist's work stealing sends at the start: each idle node in turn gets
    ``len(pending) // nodes_remaining`` of what is left (xdist/scheduler/worksteal.py)."""
    counts, left = [], total
    for i in range(workers):
        n = left // (workers - i)
        counts.append(n)
        left -= n
    return counts


def arrange(tests: Sequence[Test], workers: int) -> list[int]:
    """Indices into ``tests``: the new order. Unchanged for one worker, or where the heavy modules
    do not fit the slices' counts (then xdist's own stealing is all there is)."""
    order = list(range(len(tests)))
    if workers < 2 or len(tests) < 2 * workers:
        return order
    modules: dict[str, list[int]] = {}
    for i, t in enumerate(tests):
        modules.setdefault(t.nodeid.split("::", 1)[0], []).append(i)
    heavy = [ix for ix in modules.values() if max(tests[i].cost for i in ix) >= HEAVY_S]
    heavy_set = {i for ix in heavy for i in ix}
    light = [i for i in order if i not in heavy_set]
    counts = slice_counts(len(tests), workers)
    load = [0.0] * workers
    slices: list[list[list[int]]] = [[] for _ in range(workers)]
    used = [0] * workers
    # Longest processing time first: each heavy module to the slice with the least so far that
    # still has room for it.
    for ix in sorted(heavy, key=lambda ix: (-sum(tests[i].cost for i in ix), ix[0])):
        room = [w for w in range(workers) if used[w] + len(ix) <= counts[w]]
        if not room:
            return order
        w = min(room, key=lambda w: (load[w], w))
        slices[w].append(ix)
        load[w] += sum(tests[i].cost for i in ix)
        used[w] += len(ix)
    out: list[int] = []
    rest = iter(light)
    for w in range(workers):
        for ix in sorted(slices[w], key=lambda ix: (-sum(tests[i].cost for i in ix), ix[0])):
            out.extend(ix)
        out.extend(next(rest) for _ in range(counts[w] - used[w]))
    return out
