"""Runs every benchmark module (bench/bench_*.py, each with run() -> rows) and prints one
markdown table, stamped once. ``scripts/bench [names...]`` runs a subset, e.g.
``scripts/bench core watch``.

A run of every suite (no names) also writes its table into BENCHMARKS.md, replacing the whole
"## Latest table" section, so that the table there always comes from one run: no row is carried
over from another. A subset only prints (``--write`` makes it write anyway, marked as partial;
``--no-write`` keeps a full run from writing).
"""
from __future__ import annotations

import importlib
import os
import platform
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

ORDER = ["core", "watch", "metricfiles", "trainers", "busy", "checkpoints", "health", "reboot", "soak", "cluster", "recovery", "prewarm", "overhead"]
BENCHMARKS = HERE.parent / "BENCHMARKS.md"
SECTION = "## Latest table"


def write_table(text: str, path: Path = BENCHMARKS) -> None:
    """Replace the body of the "## Latest table" section (up to the next "## " heading)."""
    doc = path.read_text()
    start = doc.index(SECTION) + len(SECTION)
    nxt = doc.find("\n## ", start)
    end = nxt + 1 if nxt >= 0 else len(doc)
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text(doc[:start] + "\n\n" + text.rstrip("\n") + "\n\n" + doc[end:])
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    import structlog

    flags = {a for a in argv if a.startswith("--")}
    names = [a for a in argv if not a.startswith("--")]
    full = not names
    write = ("--write" in flags or full) and "--no-write" not in flags
    # The suites exercise monitors in-process; their event lines are not part of the table.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(open(os.devnull, "w")))
    names = names or [n for n in ORDER if (HERE / f"bench_{n}.py").exists()]
    t0 = time.monotonic()
    stamp = (f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.machine()}, "
             f"{len(os.sched_getaffinity(0))} cores, Python {platform.python_version()}")
    lines = ["| suite | figure | value | unit | target |", "|---|---|---:|---|---|"]
    print(f"# transformer-supervisor benchmarks ({stamp})\n")
    for line in lines:
        print(line)
    failed = 0
    for n in names:
        try:
            mod = importlib.import_module(f"bench_{n}")
            rows = mod.run()
        except Exception:
            failed += 1
            rows = [{"name": f"FAILED: {traceback.format_exc(limit=1).splitlines()[-1]}", "value": ""}]
        for r in rows:
            line = f"| {n} | {r['name']} | {r['value']} | {r.get('unit', '')} | {r.get('target', '')} |"
            lines.append(line)
            print(line, flush=True)
    took = (time.monotonic() - t0) / 60
    scope = "all suites" if full else "partial: " + ", ".join(names)
    print(f"\n({scope}; took {took:.0f} min)")
    if write:
        write_table(f"Run ({stamp}; {scope}; took {took:.0f} min)\n\n" + "\n".join(lines))
        print(f"(written to {BENCHMARKS.name}, section \"{SECTION[3:]}\")", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
