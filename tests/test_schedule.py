"""The suite's order under xdist (tests/helpers/schedule.py): a permutation, slices of exactly the
counts work stealing cuts, the heavy modules spread over them and first in each, whole."""
from __future__ import annotations

from pathlib import Path

from tests.helpers.schedule import GUESS_S, GUESS_SLOW_S, Test, arrange, guess, read_costs, slice_counts


def suite() -> list[Test]:
    tests = []
    for m in range(5):  # five heavy modules of three tests, one fixture each: 30, 25, 20, 15, 10 s
        tests += [Test(f"tests/e2e/test_h{m}.py::t{k}", (30 - 5 * m) / 3) for k in range(3)]
    for m in range(10):  # and forty light tests
        tests += [Test(f"tests/unit/test_l{m}.py::t{k}", 0.1) for k in range(4)]
    return tests


def test_slice_counts_are_what_work_stealing_sends() -> None:
    assert slice_counts(10, 4) == [2, 2, 3, 3] and sum(slice_counts(1433, 4)) == 1433
    assert slice_counts(5, 1) == [5]


def test_heavy_modules_are_spread_first_in_each_slice_and_kept_whole() -> None:
    tests = suite()
    order = arrange(tests, 4)
    assert sorted(order) == list(range(len(tests)))
    slices, pos = [], 0
    for n in slice_counts(len(tests), 4):
        slices.append([tests[i] for i in order[pos:pos + n]])
        pos += n
    loads = sorted(sum(t.cost for t in s) for s in slices)
    # Longest first: 30 | 25 | 20 | 15 + 10, the light 4 s spread; in collection order the first
    # slice held 90 s of the 104.
    assert loads[-1] - loads[0] <= 11, loads
    for s in slices:
        assert s[0].cost > 1, [t.nodeid for t in s]  # a heavy module starts every slice
        heavy = [t.nodeid for t in s if t.cost > 1]
        assert heavy == [t.nodeid for t in s[:len(heavy)]], "the heavy tests come before the light ones"
    home = {t.nodeid.split("::")[0]: w for w, s in enumerate(slices) for t in s if t.cost > 1}
    for w, s in enumerate(slices):
        assert all(home[t.nodeid.split("::")[0]] == w for t in s if t.cost > 1), "a heavy module stays whole"


def test_one_worker_or_too_few_tests_keep_the_collection_order() -> None:
    tests = suite()
    assert arrange(tests, 1) == list(range(len(tests)))
    assert arrange(tests[:5], 4) == list(range(5))


def test_costs_come_from_the_recorded_file_else_from_the_marks(tmp_path: Path) -> None:
    f = tmp_path / "cpu.tsv"
    # A full TSUP_TEST_CPU line is its wall seconds (how long it holds a worker: c.py mostly
    # waits), a two-column line its CPU seconds.
    f.write_text("12.5\ttests/a.py::t\nnot a number\ttests/b.py::t\n0.30\t41.2\tgw0\t1\t2\ttests/c.py::t\n")
    costs = read_costs(f)
    assert costs == {"tests/a.py::t": 12.5, "tests/c.py::t": 41.2}
    assert guess("tests/a.py::t", {"slow"}, costs) == 12.5
    assert guess("tests/new.py::t", {"slow"}, costs) == GUESS_SLOW_S and guess("tests/new.py::t", set(), costs) == GUESS_S
    assert read_costs(tmp_path / "missing.tsv") == {}
