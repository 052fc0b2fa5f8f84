"""Every curated mutation of scripts/mutants.py still applies to the code (issue 22: four of its
mutations had silently stopped matching and were "not applied" for most of a day). Fast: it
only reads the files; ./scripts/mutants runs the suite against each."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _mutations():
    spec = importlib.util.spec_from_file_location("tsup_mutants", ROOT / "scripts" / "mutants.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass looks its module up while being made
    spec.loader.exec_module(mod)
    return mod.MUTATIONS


def test_every_mutation_matches_its_snippet_exactly_once_and_its_hints_exist():
    mutations = _mutations()
    assert len(mutations) >= 20
    stale = []
    for m in mutations:
        target = ROOT / m.path
        found = target.read_text().count(m.old) if target.exists() else -1
        if found != 1 or m.new == m.old:
            stale.append(f"{m.name}: {m.path} holds the snippet {found} time(s)" if found >= 0
                         else f"{m.name}: {m.path} does not exist")
        stale += [f"{m.name}: hint {h} does not exist" for h in m.hint if not (ROOT / h).exists()]
    assert not stale, "stale mutations in scripts/mutants.py (update each to the code it targets):\n" + "\n".join(stale)
    assert len({m.name for m in mutations}) == len(mutations), "two mutations share a name"
