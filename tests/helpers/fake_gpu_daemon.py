"""Test-only: the real daemon (``python -m supervisor ARGS...``) with the scripted fake GPU backend.

    python tests/helpers/fake_gpu_daemon.py TIMELINE.json ARGS...

Production has no way to swap a node's GPU health for a fake (no environment variable, no config
value): ``gpu.backend`` is ``nvml`` or ``none``. The end-to-end tests inject the fake here, in a
process of their own, by replacing the backend factory the daemon calls
(``supervisor.health.make_backend``) before the CLI starts. Timeline format: see
``supervisor/health/gpufake.py`` (:meth:`FakeBackend.from_file`).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from supervisor import health  # noqa: E402
from supervisor.health.gpufake import FakeBackend  # noqa: E402


def main() -> int:
    timeline = sys.argv[1]
    health.make_backend = lambda _spec, **_kw: FakeBackend.from_file(timeline)  # type: ignore[assignment]
    from supervisor.cli.main import main as cli_main

    return cli_main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
