"""Regenerates the measured parts of docs/demo.md from one real run of ``./scripts/demo``.

Three steps, each a function the test (tests/demo/test_demo_docs.py) can call on its own:

1. ``run_demo(work)``: ``./scripts/demo --out WORK/demo-out`` (the command a user runs, its
   defaults), the console kept in ``WORK/console.txt``, the machine in ``WORK/machine.json``.
2. ``collect(work)``: the record of that run (the console, ``job_summary.json``, a few of the
   job's own lines, the ledger's attempts and goodput, the machine), paths shown as
   ``demo-out``; written to ``tests/demo/fixtures/demo_run.json``.
3. ``render(record)`` -> the blocks, and ``splice(doc, blocks)`` puts each between its markers
   ``<!-- generated: NAME ... -->`` and ``<!-- /generated -->`` in docs/demo.md.

Nothing in the blocks is typed by hand: a stale doc or a renderer that drifts from the doc fails
the test, which renders the committed record and compares.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "demo.md"
FIXTURE = ROOT / "tests" / "demo" / "fixtures" / "demo_run.json"
#: the demo's output dir as the docs show it (./scripts/demo's default --out)
SHOWN_OUT = "demo-out"
#: the step whose job lines the doc quotes (a periodic checkpoint after the first resume)
QUOTED_STEP = 150
BLOCK = re.compile(r"(<!-- generated: ([\w-]+)[^>]*-->\n)(.*?)(<!-- /generated -->)", re.S)
OUTPUT_IN = re.compile(r"output in (\S+) \(")
FINISHED = re.compile(r"== finished in (\d+ s) with exit code (-?\d+)")


def machine() -> dict[str, Any]:
    import torch

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True, check=False).stdout.strip()
    return {"commit": commit, "date": time.strftime("%Y-%m-%d", time.gmtime()), "cpus": os.cpu_count(),
            "load_average": round(os.getloadavg()[0], 1), "python": platform.python_version(),
            "torch": str(torch.__version__)}


def run_demo(work: Path) -> int:
    """./scripts/demo with its defaults into WORK/demo-out; its console to WORK/console.txt (and
    this terminal), the machine it ran on to WORK/machine.json. The demo's exit code."""
    (work / "machine.json").write_text(json.dumps(machine()) + "\n")
    lines = []
    with subprocess.Popen([str(ROOT / "scripts" / "demo"), "--out", str(work / SHOWN_OUT)], cwd=ROOT,
                          stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line)
    (work / "console.txt").write_text("".join(lines))
    return proc.returncode


def _json_lines(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            js = json.loads(line)
        except ValueError:
            continue
        if isinstance(js, dict):
            out.append(js)
    return out


def collect(work: Path) -> dict[str, Any]:
    """The record of the run kept in WORK: everything the blocks are rendered from."""
    console = (work / "console.txt").read_text()
    m = OUTPUT_IN.search(console)
    if not m:
        raise SystemExit(f"{work}/console.txt has no 'output in DIR' line: not a demo's console")
    out = Path(m.group(1))
    if not out.is_dir():
        out = work / SHOWN_OUT

    def shown(text: str) -> str:
        return text.replace(m.group(1), SHOWN_OUT).replace(str(out), SHOWN_OUT)

    job = [shown(json.dumps(js)) for js in _json_lines(out / "job.log") if js.get("step") == QUOTED_STEP][:2]
    first = next((js for js in _json_lines(out / "job.log") if "loss" in js), {})
    from supervisor.ledger.store import Ledger
    from supervisor.report.collect import goodput_from_ledger

    led = Ledger(out / "state", readonly=True)
    try:
        hist = led.history()
        goodput = goodput_from_ledger(led, hist["run_id"])
    finally:
        led.close()
    attempts = [{k: a.get(k) for k in ("attempt", "cause", "action", "resume_step")}
                for a in hist["attempts"]]
    return {"machine": json.loads((work / "machine.json").read_text()),
            "console": [shown(line) for line in console.splitlines()],
            "job_summary": json.loads((out / "job_summary.json").read_text()),
            "first_metric": {"step": first.get("step"), "loss": first.get("loss")},
            "job_lines": job,
            "attempts": attempts,
            "goodput": goodput}


def _num(v: Any, places: int = 4) -> str:
    return f"{v:.{places}f}" if isinstance(v, float) else str(v)


def render(rec: dict[str, Any]) -> dict[str, str]:
    """Each generated block's text (its lines between the markers), from a record."""
    mc, js, gp = rec["machine"], rec["job_summary"], rec.get("goodput") or {}
    said = [line.split("] ", 1)[-1] for line in rec["console"]]
    ends = [FINISHED.match(line) for line in said]
    end = next(i for i, m in enumerate(ends) if m)
    wall, code = ends[end].groups()
    measured = [
        f"- Run at commit `{mc['commit']}` on {mc['date']} (`./scripts/demo_docs`): {mc['cpus']} cores, "
        f"load average {mc['load_average']} when it started, torch {mc['torch']}, Python {mc['python']}.",
        f"- `./scripts/demo` with its defaults: exit code {code} after {len(rec['attempts'])} attempts "
        f"in {wall} of wall time.",
        f"- The loss: {_num(rec['first_metric']['loss'])} at step {rec['first_metric']['step']}, "
        f"{_num(js.get('loss'))} at step {js.get('step')} (val loss {_num(js.get('val_loss'))}).",
    ]
    if gp:
        lost = ", ".join(f"{k} {v:.1f} s" for k, v in sorted((gp.get("lost_by_cause") or {}).items()))
        measured.append(f"- Goodput {gp['ratio']:.3f}: {gp['productive_s']:.1f} s of training kept "
                        f"({gp['kept_steps']} steps; {gp['lost_steps']} steps trained again) of "
                        f"{gp['total_s']:.1f} s; lost by cause: {lost or 'none'}.")
    return {"demo-job-lines": "```\n" + "\n".join(rec["job_lines"]) + "\n```\n",
            "demo-measured": "\n".join(measured) + "\n",
            "demo-console": "```text\n" + "\n".join(rec["console"]) + "\n```\n"}


def blocks_of(doc: str) -> dict[str, str]:
    """The generated blocks of a doc by name (their text between the markers)."""
    return {m.group(2): m.group(3) for m in BLOCK.finditer(doc)}


def splice(doc: str, blocks: dict[str, str]) -> str:
    """The doc with each named block's text replaced; every block must have its markers, once."""
    found = [m.group(2) for m in BLOCK.finditer(doc)]
    missing = sorted(set(blocks) - set(found))
    twice = sorted({n for n in found if found.count(n) > 1})
    if missing or twice:
        raise ValueError(f"docs/demo.md: blocks without markers: {missing}; blocks marked twice: {twice}")
    return BLOCK.sub(lambda m: m.group(1) + blocks.get(m.group(2), m.group(3)) + m.group(4), doc)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--from", dest="src", metavar="DIR",
                    help="re-render from a kept run (DIR/console.txt, DIR/machine.json, DIR/demo-out) "
                         "instead of running the demo")
    args = ap.parse_args(argv)
    if args.src:
        work = Path(args.src)
    else:
        work = Path(tempfile.mkdtemp(prefix="tsup-demo-docs-"))
        code = run_demo(work)
        if code != 0:
            print(f"demo_docs: the demo exited {code}; docs/demo.md left as it was (the run is in {work})",
                  file=sys.stderr)
            return 1
    rec = collect(work)
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text(json.dumps(rec, indent=1) + "\n")
    DOC.write_text(splice(DOC.read_text(), render(rec)))
    print(f"demo_docs: docs/demo.md regenerated, the record in {FIXTURE.relative_to(ROOT)} (the run: {work})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
