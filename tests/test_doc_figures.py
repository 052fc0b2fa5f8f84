"""Every measured figure README.md and docs/*.md quote comes from BENCHMARKS.md's Latest table
(issue 38 part 5, issue 37's "every number in docs/ regenerated at HEAD").

A quoted measurement is a link to its row's anchor: ``[254.0 ms](../BENCHMARKS.md#overhead-stage-first-event)``.
The link's text must be the row's value and unit exactly as the Latest table holds them, so a new
full run (bench/run.py) that moves a figure fails here until the doc quotes the new one. A bound or
a default ("30 s", "450 lines") is no measurement and carries no link; a sentence that says a
figure was measured without linking its row fails (``measured 0.6 s`` with no row behind it).
Also: bench/run.py's writer keeps one table (a full run moves the replaced one to the history, a
partial run never replaces a row of it)."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

from tests.test_docs import DOCS, prose_lines

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "BENCHMARKS.md"
FIGURE = re.compile(r"\[([^\[\]]+)\]\((?:\.\./)?BENCHMARKS\.md#([\w-]+)\)")
ROW = re.compile(r'^\| [\w-]+ \| <a id="([\w-]+)"></a>.*\| ([^|]*) \| ([^|]*) \| [^|]* \|$')
# A number with a unit of time, size, rate, ratio or share, said to be measured in the same clause.
SAID_MEASURED = re.compile(r"\bmeasured\b(?:[^.;:]|\.\d){0,80}?\d[\d.,]*(?:\s?-\s?\d[\d.,]*)?\s?"
                           r"(?:ms|s|us|ns|MB|MiB|KB|KiB|GB|lines/s|x|%)(?!\w)",
                           re.IGNORECASE)
GENERATED = re.compile(r"<!-- generated: .*?<!-- /generated -->", re.DOTALL)  # scripts/demo_docs rewrites those


def latest_rows(text: str) -> dict[str, str]:
    """Anchor -> "value unit" of each anchored row of the "## Latest table" section alone."""
    start = text.index("\n## Latest table") + 1
    end = text.find("\n## ", start)
    rows: dict[str, str] = {}
    for line in text[start:end if end >= 0 else len(text)].splitlines():
        m = ROW.match(line)
        if m:
            rows[m.group(1)] = f"{m.group(2).strip()} {m.group(3).strip()}".strip()
    return rows


def misquoted(doc_text: str, rows: dict[str, str]) -> list[str]:
    bad = []
    for line in prose_lines(GENERATED.sub("", doc_text)):
        for text, anchor in FIGURE.findall(line):
            if not re.match(r"[-+]?\d", text):
                continue  # a link to a row by its words, quoting no figure
            if anchor not in rows:
                bad.append(f"[{text}](#{anchor}): no such row in the Latest table")
            elif text != rows[anchor]:
                bad.append(f"[{text}](#{anchor}): the Latest table says {rows[anchor]!r}")
    return bad


def said_measured_unlinked(doc_text: str) -> list[str]:
    out = []
    for line in prose_lines(GENERATED.sub("", doc_text)):
        out += [m.group(0) for m in SAID_MEASURED.finditer(FIGURE.sub("(a row)", line))]
    return out


def test_every_figure_the_readme_and_docs_quote_is_its_rows_value_in_the_latest_table() -> None:
    rows = latest_rows(BENCHMARKS.read_text(encoding="utf-8"))
    quoted = 0
    bad = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        quoted += len(FIGURE.findall(text))
        bad += [f"{doc.relative_to(ROOT)}: {b}" for b in misquoted(text, rows)]
    assert quoted >= 5, f"only {quoted} figures quoted from BENCHMARKS.md: the marker pattern no longer matches"
    assert not bad, "figures that are not the Latest table's:\n" + "\n".join(bad)


def test_no_doc_says_a_figure_was_measured_without_linking_its_row() -> None:
    bad = [f"{doc.relative_to(ROOT)}: {hit!r}" for doc in DOCS for hit in said_measured_unlinked(doc.read_text("utf-8"))]
    assert not bad, ("a measured figure with no row behind it (link the row, or say it as a bound):\n" + "\n".join(bad))


TABLE = """# B

## Latest table: 2026-12-05, commit abc

| suite | figure | value | unit | target |
|---|---|---:|---|---|
| core | <a id="core-x"></a>restart gap | 93.2 | ms | report |
| core | no anchor | 7 | s | report |

## Partial run, not the Latest table: 2026-12-07, commit def (suites core)

| suite | figure | value | unit | target |
|---|---|---:|---|---|
| core | <a id="core-y"></a>new row | 1.5 | s | report |
"""


def test_a_figure_is_checked_against_the_latest_table_only() -> None:
    rows = latest_rows(TABLE)
    assert rows == {"core-x": "93.2 ms"}
    assert misquoted("gap [93.2 ms](../BENCHMARKS.md#core-x), words [the row](BENCHMARKS.md#core-x)", rows) == []
    assert misquoted("[93.1 ms](../BENCHMARKS.md#core-x)", rows) == ["[93.1 ms](#core-x): the Latest table says '93.2 ms'"]
    assert misquoted("[1.5 s](BENCHMARKS.md#core-y)", rows) == ["[1.5 s](#core-y): no such row in the Latest table"]
    assert said_measured_unlinked("a restart shows (measured 0.6-0.75 s after it)") == ["measured 0.6-0.75 s"]
    assert said_measured_unlinked("measured: [93.2 ms](BENCHMARKS.md#core-x)") == []
    assert said_measured_unlinked("a bound of 30 s, measured against its peer") == []


def _run_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_run_under_test", ROOT / "bench" / "run.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_writer_keeps_one_table_and_moves_the_replaced_one_to_the_history(tmp_path: Path) -> None:
    run = _run_module()
    doc, hist = tmp_path / "B.md", tmp_path / "H.md"
    doc.write_text(TABLE + "\n## After\n\ntext\n")
    line = run.row_line("core", {"id": "core-x", "name": "restart gap", "value": 50.0, "unit": "ms", "target": "report"})
    assert line == '| core | <a id="core-x"></a>restart gap | 50.0 | ms | report |'
    # A partial run adds its own section, replacing an earlier one of the same suites; the Latest rows stay.
    run.write_table("## Partial run, not the Latest table: 2026-12-08, commit fff (suites core)", "P2", False, doc, hist)
    text = doc.read_text()
    assert latest_rows(text) == {"core-x": "93.2 ms"}
    assert text.count("## Partial run") == 1 and "P2" in text and "core-y" not in text
    assert "commit def" in hist.read_text()
    # A full run replaces the Latest table and moves it, with the partial run, to the history.
    run.write_table("## Latest table: 2026-12-09, commit 999", "| core | x |", True, doc, hist)
    text, old = doc.read_text(), hist.read_text()
    assert "## Latest table: 2026-12-09, commit 999" in text and "## Partial run" not in text
    assert "93.2" not in text and "## After" in text
    assert "## Earlier: Latest table: 2026-12-05, commit abc" in old and "93.2" in old
    assert "## Earlier: Partial run, not the Latest table: 2026-12-08" in old
    assert old.index("2026-12-05") < old.index("commit def"), "the newest older table first"
