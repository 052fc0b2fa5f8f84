"""Runs every benchmark module (bench/bench_*.py, each with run() -> rows) and prints one
markdown table, stamped once. ``scripts/bench [names...]`` runs a subset, e.g.
``scripts/bench core watch``.

BENCHMARKS.md holds one table: a run of every suite (no names) writes it as the "## Latest table"
section, its heading naming the commit and the machine, and moves the table it replaces (and any
partial run written since) into BENCHMARKS-history.md, so that every row there comes from that one
run. A subset only prints; ``--write`` writes it as a "## Partial run" section under the Latest
table, headed as partial, which never replaces a row of the Latest table (the next full run moves
it to the history). ``--no-write`` keeps a full run from writing.

A row is a dict: name, value, unit, target, and optionally id (a stable anchor, written as
``<a id="ID"></a>`` before the figure, that README.md and docs/ link to when they quote the value:
tests/test_doc_figures.py checks each quoted value against the Latest table).
"""
from __future__ import annotations

import importlib
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

ORDER = ["core", "watch", "metricfiles", "trainers", "busy", "torchrun", "checkpoints", "health", "reboot", "soak", "cluster", "recovery", "prewarm", "overhead"]
BENCHMARKS = HERE.parent / "BENCHMARKS.md"
HISTORY = HERE.parent / "BENCHMARKS-history.md"
LATEST = "## Latest table"
PARTIAL = "## Partial run"
HISTORY_MARK = "<!-- older tables below, newest first; bench/run.py moves each replaced table here -->"


def commit() -> str:
    """The commit the suites ran at, and whether the code they ran differed from it."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=HERE.parent, capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    sha = git("rev-parse", "--short", "HEAD") or "unknown commit"
    dirty = git("status", "--porcelain", "--", "bench", "supervisor")
    return f"commit {sha}" + (" + uncommitted changes in bench/ or supervisor/" if dirty else "")


def machine() -> str:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()[0]
    return (f"{platform.machine()}{' ' + model if model else ''}, {len(os.sched_getaffinity(0))} cores, "
            f"Python {platform.python_version()}, load average {load:.1f} at start")


def row_line(suite: str, r: dict) -> str:
    anchor = f'<a id="{r["id"]}"></a>' if r.get("id") else ""
    return f"| {suite} | {anchor}{r['name']} | {r['value']} | {r.get('unit', '')} | {r.get('target', '')} |"


def _sections(doc: str) -> list[tuple[int, int]]:
    """(start, end) of each "## " section of the document."""
    starts = [i + 1 for i in range(len(doc)) if doc.startswith("\n## ", i)]
    return [(s, e) for s, e in zip(starts, [*starts[1:], len(doc)])]


def write_table(heading: str, body: str, full: bool, path: Path = BENCHMARKS, history: Path = HISTORY) -> None:
    """A full run replaces the Latest table and moves it, with every partial run, to the history;
    a partial run adds its own section after the Latest table (replacing one of the same suites)."""
    doc = path.read_text()
    secs = _sections(doc)
    latest = next((s, e) for s, e in secs if doc.startswith(LATEST, s))
    partials = [(s, e) for s, e in secs if doc.startswith(PARTIAL, s)]
    new = f"{heading}\n\n{body.rstrip()}\n\n"
    if full:
        moved = [doc[s:e] for s, e in (latest, *partials)]
        keep = [(s, e) for s, e in secs if (s, e) != latest and (s, e) not in partials]
        head = doc[: secs[0][0]]
        doc = head + "".join(new if (s, e) == latest else doc[s:e] for s, e in sorted([latest, *keep]))
    else:
        same = [(s, e) for s, e in partials if doc[s:doc.index("\n", s)].endswith(heading.rsplit(" (", 1)[-1])]
        moved = [doc[s:e] for s, e in same]
        for s, e in reversed(same):
            doc = doc[:s] + doc[e:]
        at = latest[1] if not same or same[0][0] > latest[1] else same[0][0]
        doc = doc[:at] + new + doc[at:]
    if moved:
        old = history.read_text() if history.exists() else f"# Benchmarks: older runs\n\n{HISTORY_MARK}\n"
        cut = old.index(HISTORY_MARK) + len(HISTORY_MARK)
        demoted = "".join("\n" + m.replace("## ", "## Earlier: ", 1).rstrip() + "\n" for m in moved)
        tmp = history.with_suffix(".md.tmp")
        tmp.write_text(old[:cut] + "\n" + demoted + old[cut:])
        os.replace(tmp, history)
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text(doc)
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
    stamp = f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {commit()}, {machine()}"
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
            line = row_line(n, r)
            lines.append(line)
            print(line, flush=True)
    took = (time.monotonic() - t0) / 60
    scope = "all suites" if full else "partial: " + ", ".join(names)
    print(f"\n({scope}; took {took:.0f} min)")
    if write:
        if full:
            heading = f"{LATEST}: {stamp}"
            note = (f"Every row below comes from this one run (all suites, {took:.0f} min). Runs before it: "
                    "[BENCHMARKS-history.md](BENCHMARKS-history.md).")
        else:
            heading = f"{PARTIAL}, not the Latest table: {stamp} (suites {', '.join(names)})"
            note = (f"A partial run ({took:.0f} min): only these suites, at the commit named above; it replaces no "
                    "row of the Latest table, and the next full run moves it to BENCHMARKS-history.md.")
        write_table(heading, note + "\n\n" + "\n".join(lines), full)
        print(f"(written to {BENCHMARKS.name}: {heading[3:]})", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
