"""docs/reliability.md's input-budget table ("Input budgets") covers every reader (issue 34 part 8).

The criterion: a module of ``supervisor/watch/``, ``supervisor/checkpoints/`` or ``supervisor/ops/``
(sub-folders included) is a *reader* when it reads bytes that the job or the world controls (a
file the job writes, a checkpoint dir, a child's output, a socket or an HTTP reply) and it is not
given those bytes already bounded by another module. Every such module is named in a row of the
table, with its bound and a test; every other module is in :data:`NOT_READERS` below, with why.
A new module is neither until someone decides which, and this test says so. Rows also name
readers elsewhere (``job/``, ``config/``); every module and test a row names must exist, and a
row without a test must say "not bounded yet".
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "docs" / "reliability.md"
CHECKED = ("supervisor/watch", "supervisor/checkpoints", "supervisor/ops")
HEADING = "## Input budgets"

#: Modules of the checked folders that read nothing the job or the world controls, and why.
NOT_READERS: dict[str, str] = {
    "supervisor/watch/__init__.py": "package exports",
    "supervisor/watch/blind.py": "keeps 5 samples of 200 characters of lines the readers already bounded",
    "supervisor/watch/busy.py": "pure: a verdict from samples look.py took",
    "supervisor/watch/config.py": "config schema",
    "supervisor/watch/detectors.py": "pure: detectors over lines and records already bounded",
    "supervisor/watch/epochsteps.py": "pure: epoch counters to steps, 64 sources at most",
    "supervisor/watch/formats.py": "pure: line parsers over lines already bounded",
    "supervisor/watch/generic.py": "pure: line parser over lines already bounded",
    "supervisor/watch/hanggate.py": "decides when to look; look.py reads",
    "supervisor/watch/liveness.py": "pure: timeouts from times",
    "supervisor/watch/nannotes.py": "pure: notes over records already parsed",
    "supervisor/watch/lossscale.py": "pure: the fp16 overflow rule over records already parsed",
    "supervisor/watch/nanahead.py": "pure: judges lines job/catchup.LogAhead already read (bounded there: AHEAD_CONTEXT "
                                     "before each hit, AHEAD_READ a look; lines past max_line_chars not parsed)",
    "supervisor/watch/parsers.py": "pure: line parsers over lines already bounded",
    "supervisor/watch/precursor.py": "pure: verdicts over records already parsed",
    "supervisor/watch/pyjson.py": "pure: JSON lines already bounded (max_line_chars, MAX_RECORD_LINE); one linear "
                                  "rewrite pass, nesting bounded by the decoder (tests/watch/test_pyjson.py)",
    "supervisor/watch/quiet.py": "rate limit of the file readers' warnings",
    "supervisor/watch/records.py": "pure: numbers and records",
    "supervisor/watch/sources.py": "bookkeeping of 32 sources at most",
    "supervisor/watch/structlines.py": "pure: structured lines already bounded",
    "supervisor/watch/textrules.py": "data: the detectors' regexes",
    "supervisor/watch/unparsed.py": "bookkeeping: counts in the source book (32 sources), 16 notices held, "
                                    "300-character samples",
    "supervisor/checkpoints/__init__.py": "package exports",
    "supervisor/checkpoints/_loadtest_script.py": "runs in the job's Python, never in the daemon (loadtest.py reads it)",
    "supervisor/checkpoints/config.py": "config schema",
    "supervisor/checkpoints/pickledeny.py": "pure: the callables a scanned pickle may never name (picklescan.py reads)",
    "supervisor/checkpoints/picklenames.py": "pure: the names a scanned pickle may import (picklescan.py reads)",
    "supervisor/checkpoints/keepfirst.py": "orchestration: snapshot, load test, keep (the rows of those modules)",
    "supervisor/checkpoints/resumechoice.py": "orchestration over the quicklist",
    "supervisor/checkpoints/selection.py": "pure: picks among quicklist rows",
    "supervisor/checkpoints/service.py": "facade over the modules in the table",
    "supervisor/checkpoints/verdicts.py": "the daemon's own state file (a 0700 state dir), 4,096 entries",
    "supervisor/checkpoints/layouts/__init__.py": "package exports",
    "supervisor/checkpoints/layouts/dcp.py": "names and markers only (discovery lists, manifest/structure read)",
    "supervisor/checkpoints/layouts/deepspeed.py": "names and markers only",
    "supervisor/checkpoints/layouts/hf.py": "names and markers only",
    "supervisor/checkpoints/layouts/lightning.py": "names and markers only",
    "supervisor/checkpoints/layouts/names.py": "names only",
    "supervisor/checkpoints/layouts/registry.py": "the list of layouts",
    "supervisor/checkpoints/layouts/safetensors_file.py": "names and markers only",
    "supervisor/checkpoints/layouts/single.py": "names and markers only",
    "supervisor/checkpoints/layouts/spec.py": "types",
    "supervisor/checkpoints/layouts/torch_file.py": "names and markers only",
    "supervisor/ops/__init__.py": "package",
    "supervisor/ops/alertmsg.py": "pure: what a notice says, the rate limit",
    "supervisor/ops/config.py": "config schema",
    "supervisor/ops/journal.py": "writes to journald only",
    "supervisor/ops/notify.py": "sends datagrams to systemd only",
    "supervisor/ops/scrapes.py": "bookkeeping of scrape times by address, 16 addresses at most (MAX_SCRAPERS)",
    "supervisor/ops/units.py": "writes unit files from the package's own data",
}

_TEST_REF = re.compile(r"`(tests/[\w/]+\.py)(?:::(\w+))?`")
_MODULE_REF = re.compile(r"`(supervisor/[\w/]+\.py)`")


def rows() -> list[list[str]]:
    """The table's rows (cells), header and rule left out."""
    text = README.read_text()
    start = text.index(HEADING)
    end = text.find("\n#", start + len(HEADING))
    lines = [ln for ln in text[start:end if end != -1 else None].splitlines() if ln.startswith("|")]
    assert len(lines) > 2, f"no table under {HEADING!r} in docs/reliability.md"
    return [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines[2:]]


def named_modules() -> set[str]:
    return {m for r in rows() for m in _MODULE_REF.findall(r[1])}


def checked_modules() -> set[str]:
    return {str(p.relative_to(ROOT)) for d in CHECKED for p in (ROOT / d).rglob("*.py")}


def test_every_module_of_the_reader_folders_is_classified_once():
    named = named_modules()
    missing = sorted(checked_modules() - named - set(NOT_READERS))
    assert not missing, ("each module of supervisor/watch, checkpoints and ops is either a reader, with a row in "
                         "docs/reliability.md's 'Input budgets' table (its bound and a test), or a non-reader in NOT_READERS of "
                         f"tests/test_budget_table.py with why; unclassified: {missing}")
    both = sorted(named & set(NOT_READERS))
    assert not both, f"both in the table and in NOT_READERS: {both}"


def test_every_module_and_test_the_table_names_exists():
    stale = sorted(m for m in set(NOT_READERS) | named_modules() if not (ROOT / m).is_file())
    assert not stale, f"named but not there (renamed? removed?): {stale}"
    for cells in rows():
        assert len(cells) == 5, f"a row has 5 cells (input, modules, bound, past it, tests): {cells}"
        refs = _TEST_REF.findall(cells[4])
        if not refs:
            assert "not bounded yet" in cells[2], f"a row with no test must say 'not bounded yet': {cells[0]}"
        for path, name in refs:
            assert (ROOT / path).is_file(), f"{cells[0]}: no test file {path}"
            if name:
                tree = ast.parse((ROOT / path).read_text())
                defs = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
                assert name in defs, f"{cells[0]}: no test {name} in {path}"


def test_the_bounds_the_table_quotes_are_the_code_s():
    """A few bounds as written in the table, against the constants that enforce them: a change of
    one without the other fails here."""
    from supervisor.checkpoints.loadtest import OUTPUT_TAIL_BYTES
    from supervisor.checkpoints.manifest import MAX_MANIFEST_BYTES
    from supervisor.checkpoints.warm import LINE_BYTES
    from supervisor.childio import KEEP_BYTES
    from supervisor.ops.alerts import QUEUE_SIZE
    from supervisor.ops.control import MAX_REQUEST, READ_TIMEOUT_S, REFUSED_QUIET_S
    from supervisor.ops.delivery import HOOK_STDERR_BYTES, REPLY_BYTES
    from supervisor.watch.stacks import DUMP_BYTES

    table = "\n".join("|".join(r) for r in rows())
    for constant, said in ((OUTPUT_TAIL_BYTES, "256 KiB tail"), (MAX_MANIFEST_BYTES, "1 MiB (`MAX_MANIFEST_BYTES`)"),
                           (LINE_BYTES, "1 MiB (`LINE_BYTES`)"), (KEEP_BYTES, "64 KiB tail"),
                           (QUEUE_SIZE, "32 notices"), (MAX_REQUEST, "64 KiB a request"),
                           (READ_TIMEOUT_S, "5 s for all of it"), (REFUSED_QUIET_S, "10 s without one"),
                           (HOOK_STDERR_BYTES, "4 KiB tail of stderr"), (REPLY_BYTES, "4 KiB of the body"),
                           (DUMP_BYTES, "first 4 MiB")):
        assert said in table, f"docs/reliability.md's table no longer says {said!r}"
        number = float(said.split()[1] if said.startswith("first") else said.split()[0])
        unit = {"KiB": 1 << 10, "MiB": 1 << 20}.get(said.split()[2 if said.startswith("first") else 1], 1)
        assert constant == number * unit, f"{said!r} in docs/reliability.md, {constant} in the code"
    from supervisor.checkpoints.listing import LISTING_CAP, NEWEST_KEPT
    from supervisor.ops.delivery import MAX_LOOKUPS
    from supervisor.ops.metricserver import DEADLINE_S, MAX_CONNECTIONS

    for said in (f"{LISTING_CAP:,} entries read a scan (`LISTING_CAP`)", f"newest {NEWEST_KEPT:,} by mtime (`NEWEST_KEPT`",
                 f"{MAX_CONNECTIONS} connections at once (`MAX_CONNECTIONS`", f"{DEADLINE_S:g} s each from its accept (`DEADLINE_S`",
                 f"{MAX_LOOKUPS} lookups in flight (`MAX_LOOKUPS`)"):
        assert said in table, f"docs/reliability.md's table no longer says {said!r} (or the code's constant changed)"
    from supervisor.watch.hbfiles import LIST_PER_CHECK, MAX_RANK_FILES, RECORD_READ

    for said in (f"{LIST_PER_CHECK:,} entries a check (`LIST_PER_CHECK`",
                 f"{MAX_RANK_FILES} heartbeat files and {MAX_RANK_FILES} metric files followed (`MAX_RANK_FILES`)",
                 f"{RECORD_READ >> 10} KiB read of each (`RECORD_READ`)"):
        assert said in table, f"docs/reliability.md's table no longer says {said!r} (or the code's constant changed)"
