"""Runs every benchmark module (bench/bench_*.py, each with run() -> rows) and prints one
markdown table. ``scripts/bench [names...]`` runs a subset, e.g. ``scripts/bench core watch``."""
from __future__ import annotations

import importlib
import platform
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

ORDER = ["core", "watch", "trainers", "checkpoints", "health", "reboot"]


def main(argv: list[str]) -> int:
    import os

    import structlog

    # The suites exercise monitors in-process; their event lines are not part of the table.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(open(os.devnull, "w")))
    names = argv or [n for n in ORDER if (HERE / f"bench_{n}.py").exists()]
    print(f"# transformer-supervisor benchmarks ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{platform.machine()}, {len(__import__('os').sched_getaffinity(0))} cores, Python {platform.python_version()})\n")
    print("| suite | figure | value | unit | target |")
    print("|---|---|---:|---|---|")
    failed = 0
    for n in names:
        try:
            mod = importlib.import_module(f"bench_{n}")
            rows = mod.run()
        except Exception:
            failed += 1
            print(f"| {n} | FAILED: {traceback.format_exc(limit=1).splitlines()[-1]} | | | |")
            continue
        for r in rows:
            print(f"| {n} | {r['name']} | {r['value']} | {r.get('unit', '')} | {r.get('target', '')} |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
