"""A DCP checkpoint's ``.metadata`` is a plain pickle, and torch's DCP reader loads it with
``pickle.load`` (no weights_only). The load test runs as the daemon's user, under the default
``verify`` too, where no pickle scan ran before it: the child must read ``.metadata`` through an
allowlist (DCP's own data classes, torch's tensor-rebuild names) and refuse anything else, so a
payload in it never runs. Real DCP saves, written by torch in a subprocess of the venv's Python
(tests/helpers/hostile_pickles.py, which proves the payload runs under DCP's own reader)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
import pytest

from supervisor.checkpoints.loadtest import LoadTestRequest, run_load_test
from tests.conftest import ROOT

HELPER = ROOT / "tests" / "helpers" / "hostile_pickles.py"


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a DCP folder whose .metadata runs ``touch MARKER`` when DCP's reader loads it, MARKER)."""
    out = tmp_path_factory.mktemp("hostile")
    subprocess.run([sys.executable, str(HELPER), str(out)], check=True, timeout=300)
    entry = json.loads((out / "index.json").read_text())["dcp_metadata"]
    assert entry["ran"], "DCP's own reader runs the payload: the fixture is a real attack"
    return out, Path(str(entry["marker"]))


def _checkpoint_dir(out: Path, tmp_path: Path) -> Path:
    ck = tmp_path / "ck"
    ck.mkdir()
    shutil.copytree(out / "good_dcp", ck / "step-50")
    shutil.copytree(out / "dcp_metadata", ck / "step-100")  # the newest, with the payload
    for f in ck.rglob("*"):  # settled: written a minute ago, not "still being written"
        os.utime(f, (f.stat().st_atime - 60, f.stat().st_mtime - 60))
    return ck


@pytest.mark.slow
def test_the_checkpoints_verb_never_runs_a_payload_in_dcp_metadata(made: tuple[Path, Path], tmp_path: Path) -> None:
    out, marker = made
    ck = _checkpoint_dir(out, tmp_path)
    r = subprocess.run([sys.executable, "-m", "supervisor", "checkpoints", "--checkpoint-dir", str(ck), "--json"],
                       cwd=str(ROOT), capture_output=True, text=True, timeout=300)
    assert not marker.exists(), "the load test ran the payload of .metadata"
    rows = {Path(r["path"]).name: r for r in json.loads(r.stdout)}
    bad, good = rows["step-100"], rows["step-50"]
    assert bad["load_test"]["passed"] is False and bad["ready"] is False, bad
    assert "posix.system" in bad["load_test"]["error"] and "trust_pickles" in bad["load_test"]["error"], bad
    assert good["load_test"]["passed"] is True and good["ready"] is True, good  # DCP's own classes pass


def test_a_cold_load_test_refuses_the_payload(made: tuple[Path, Path], tmp_path: Path) -> None:
    """The verb above runs its load tests on one warm process; the daemon's restart may run a cold
    one (python -c, a request in argv): the same script, refusing the same way."""
    out, marker = made
    ck = _checkpoint_dir(out, tmp_path)
    res = run_load_test(LoadTestRequest(ck / "step-100", layout="dcp"), python=sys.executable, timeout_s=120)
    assert not marker.exists(), "the load test ran the payload of .metadata"
    assert not res.passed and res.needs_pickle and res.error is not None, res
    assert "Unsupported global: posix.system in .metadata" in res.error and "trust_pickles" in res.error, res
