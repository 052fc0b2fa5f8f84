"""docs/demo.md's measured parts are generated (issue 37 part 10): `./scripts/demo_docs` runs the
demo, records what it printed and wrote in tests/demo/fixtures/demo_run.json and renders the blocks
between `<!-- generated: NAME -->` and `<!-- /generated -->` from that record. These tests run no
demo: they render the committed record and compare with the doc, so a block edited by hand, a
renderer changed without regenerating, or a record from other demo defaults fails here."""
from __future__ import annotations

import copy
import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from supervisor.demo import DEFAULT_STEPS, format_faults

ROOT = Path(__file__).resolve().parent.parent.parent
DOC = ROOT / "docs" / "demo.md"
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "demo_run.json"


def _demo_docs() -> Any:
    spec = importlib.util.spec_from_file_location("tsup_demo_docs", ROOT / "scripts" / "demo_docs.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _record() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text())


def test_every_generated_block_has_its_markers_once_and_the_renderer_makes_each():
    mod, doc = _demo_docs(), DOC.read_text()
    names = [m.group(2) for m in mod.BLOCK.finditer(doc)]
    assert sorted(names) == sorted(mod.render(_record())) == ["demo-console", "demo-job-lines", "demo-measured"]
    # no stray or unclosed marker outside the pairs the script finds
    assert doc.count("<!-- generated:") == doc.count("<!-- /generated -->") == len(names)


def test_the_doc_is_what_the_renderer_makes_of_the_recorded_run():
    mod, doc = _demo_docs(), DOC.read_text()
    blocks = mod.render(_record())
    for name, text in mod.blocks_of(doc).items():
        assert text == blocks[name], f"docs/demo.md block {name} is stale: run ./scripts/demo_docs"
    assert mod.splice(doc, blocks) == doc


def test_the_blocks_are_the_records_figures_not_typed_text():
    mod = _demo_docs()
    rec = copy.deepcopy(_record())
    rec["job_summary"]["val_loss"] = 9.87654
    rec["machine"]["commit"] = "fedcba9"
    rec["console"] = [re.sub(r"finished in \d+ s", "finished in 4321 s", line) for line in rec["console"]]
    rec["job_lines"] = [line.replace('"step": ', '"step":  ') for line in rec["job_lines"]]
    new, old = mod.render(rec), mod.blocks_of(DOC.read_text())
    assert "val loss 9.8765" in new["demo-measured"] and "`fedcba9`" in new["demo-measured"]
    assert "in 4321 s of wall time" in new["demo-measured"] and "finished in 4321 s" in new["demo-console"]
    assert '"step":  150' in new["demo-job-lines"]
    assert all(new[name] != old[name] for name in new)


def test_a_doc_without_a_blocks_markers_is_refused_not_half_written():
    mod, doc = _demo_docs(), DOC.read_text()
    cut = re.sub(r"<!-- generated: demo-console[^>]*-->\n.*?<!-- /generated -->", "", doc, flags=re.S)
    with pytest.raises(ValueError, match="demo-console"):
        mod.splice(cut, mod.render(_record()))
    twice = doc + "\n<!-- generated: demo-measured -->\n<!-- /generated -->\n"
    with pytest.raises(ValueError, match="demo-measured"):
        mod.splice(twice, mod.render(_record()))


def test_the_record_is_a_finished_run_of_the_demo_with_todays_defaults():
    rec = _record()
    first = rec["console"][0]
    assert f"{DEFAULT_STEPS} steps" in first and first.endswith(f"faults: {format_faults(None)}"), first
    assert rec["job_summary"]["step"] == DEFAULT_STEPS and rec["job_summary"]["done"] is True
    assert any("== finished" in line and "exit code 0" in line for line in rec["console"])
    assert len(rec["attempts"]) == len(format_faults(None).split(",")) + 1  # one per fault, then the end
    text = json.dumps(rec)
    assert "/tmp/" not in text and "demo-out" in text  # the temp dir shown as ./scripts/demo's default
