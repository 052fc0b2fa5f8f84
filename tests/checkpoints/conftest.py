"""Every CheckpointService a test here builds is closed at its end, as the daemon closes its own:
the warm verifier it started (a torch process waiting on its stdin) would otherwise live until the
worker exits, one for each test, holding its memory through the rest of the run."""
from __future__ import annotations

from typing import Any, Iterator

import pytest

from supervisor.checkpoints.service import CheckpointService


@pytest.fixture(autouse=True)
def _services_closed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    built: list[CheckpointService] = []
    init = CheckpointService.__init__

    def tracked(self: CheckpointService, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        built.append(self)

    monkeypatch.setattr(CheckpointService, "__init__", tracked)
    yield
    for svc in built:
        svc.close()
