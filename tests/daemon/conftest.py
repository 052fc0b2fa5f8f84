"""Every test here that builds a runner on fakes (tests/fakes.py) has it closed after it: the
concerns' threads (file tailers) end with each test."""
from __future__ import annotations

from typing import Iterator

import pytest

from ..fakes import close_all


@pytest.fixture(autouse=True)
def _closed_runners() -> Iterator[None]:
    yield
    close_all()
