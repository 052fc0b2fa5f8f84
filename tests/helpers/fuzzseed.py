"""The fuzz suites' seed: a new one each run, so that every CI run tries inputs no run tried
before (a fixed, derandomized set replayed the same few hundred inputs forever). A failing test
prints its seed (tests/conftest.py reads it off the test, where hypothesis's ``@seed`` puts it)
and ``TSUP_FUZZ_SEED=N`` runs those inputs again; the failing example itself is printed too, with
the blob that ``@reproduce_failure`` replays."""
from __future__ import annotations

import os
import secrets
from typing import Any, Callable, TypeVar

from hypothesis import HealthCheck, seed, settings

# One per process: each xdist worker draws its own, and a failure names the one it ran with.
RUN_SEED = int(os.environ.get("TSUP_FUZZ_SEED") or secrets.randbits(32))

T = TypeVar("T", bound=Callable[..., Any])


def fuzz(max_examples: int, *suppress: HealthCheck) -> Callable[[T], T]:
    """For a ``@given`` test: this run's seed, ``max_examples`` inputs, no deadline (work per
    input is bounded by the linearity tests) and no example database (CI keeps none)."""
    conf = settings(derandomize=False, max_examples=max_examples, deadline=None, database=None, print_blob=True,
                    suppress_health_check=list(suppress))

    def apply(test: T) -> T:
        return seed(RUN_SEED)(conf(test))

    return apply
