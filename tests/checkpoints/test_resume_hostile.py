"""Three ways the checkpoint path could harm the run it guards or give false assurance (issue 34,
the last adversarial round), each through the real service with real files and interpreters:

1. A safetensors file whose 8-byte header length, or whose header's ``data_offsets``, point past
   the end of the file (alone, or inside an HF ``checkpoint-N/`` folder) passed the structural
   check under the default ``verify = "overlap"`` and could be handed to the job. It is refused
   as corrupt, the reason naming the file and the offsets.
2. A load test that cannot run (the job's python has no torch, the interpreter is missing, the
   process dies without a verdict) quarantined good checkpoints. It is "not tested", said once
   with what to do; the structural checks decide and nothing is moved.
3. A load test that passed on a checkpoint the pickle scan refused was logged and shown as
   ``passed`` (the log line, ``checkpoints --json``, the table, the report). It says refused,
   with the scan's reason.
"""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from supervisor.checkpoints.config import CheckpointsConfig
from supervisor.checkpoints.quicklist import render_table
from supervisor.checkpoints.resumechoice import choose
from supervisor.checkpoints.service import CheckpointService
from supervisor.checkpoints.structure import structure_problem
from tests.conftest import ROOT
from tests.helpers import ckpt_factory as F

ARGV = ["python", "train.py"]


def _svc(tmp_path: Path, python: str = sys.executable, **cfg: object) -> CheckpointService:
    (tmp_path / "state").mkdir(exist_ok=True)
    return CheckpointService(CheckpointsConfig(settle_s=0.0, **cfg), tmp_path / "ck", tmp_path / "state",  # type: ignore[arg-type]
                             python, ARGV, tmp_path)


def _raw_safetensors(path: Path, header: dict[str, object], data: bytes, n: int | None = None) -> Path:
    h = json.dumps(header).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(h) if n is None else n) + h + data)
    F.old_mtime(path)
    return path


def _w(offsets: object) -> dict[str, object]:
    return {"w": {"dtype": "F32", "shape": [4], "data_offsets": offsets}}


# ---------------------------------------------------------------- 1. safetensors bounds

@pytest.mark.parametrize("header,data,n,words", [
    (_w([0, 16]), b"\0" * 16, 1_000_000, ("header", "1000000", "past the end")),  # length past the file
    (_w([0, 16]), b"\0" * 8, None, ("'w'", "0-16", "past the end")),  # a tensor cut short
    (_w([10 ** 9, 0]), b"\0" * 16, None, ("'w'", "1000000000-0")),  # begin past end and past the file
    (_w([10 ** 9, 10 ** 9 + 16]), b"\0" * 16, None, ("'w'", "1000000000-1000000016", "past the end")),
    (_w([-16, 16]), b"\0" * 16, None, ("'w'", "-16-16")),
    (_w("99999"), b"\0" * 16, None, ("'w'", "data_offsets")),  # a string: its [1] was read as 9
    (_w([0, 1e30]), b"\0" * 16, None, ("'w'", "data_offsets")),
    (_w([0, True]), b"\0" * 16, None, ("'w'", "data_offsets")),
    ({"w": {"dtype": "F32", "shape": [4]}}, b"\0" * 16, None, ("'w'", "data_offsets")),  # none at all
    ({"w": [0, 16]}, b"\0" * 16, None, ("'w'",)),
])
def test_a_safetensors_file_pointing_past_its_end_is_refused_naming_file_and_offsets(
        tmp_path: Path, header: dict[str, object], data: bytes, n: int | None, words: tuple[str, ...]) -> None:
    p = _raw_safetensors(tmp_path / "model_300.safetensors", header, data, n)
    why = structure_problem(p)
    assert why is not None and "model_300.safetensors" in why, why
    for w in words:
        assert w in why, (w, why)


def test_a_whole_safetensors_file_still_passes(tmp_path: Path) -> None:
    assert structure_problem(F.safetensors_file(tmp_path / "model_1.safetensors")) is None
    assert structure_problem(_raw_safetensors(tmp_path / "e.safetensors", {"__metadata__": {"step": "3"}}, b"")) is None
    assert structure_problem(F.hf_folder(tmp_path, 5)) is None


def test_an_hf_folder_whose_model_safetensors_points_past_its_end_is_refused(tmp_path: Path) -> None:
    d = F.hf_folder(tmp_path, 500)
    st = d / "model.safetensors"
    data = st.read_bytes()
    st.write_bytes(struct.pack("<Q", 10 ** 6) + data[8:])
    why = structure_problem(d)
    assert why is not None and "model.safetensors" in why and "1000000" in why, why
    st.write_bytes(data[: len(data) - 4])  # the last tensor cut short
    why = structure_problem(d)
    assert why is not None and "model.safetensors" in why and "past the end" in why, why


@pytest.mark.parametrize("kind", ["file", "hf"])
def test_overlap_never_hands_over_a_safetensors_checkpoint_that_points_past_its_end(tmp_path: Path, kind: str) -> None:
    ck = tmp_path / "ck"
    if kind == "file":
        good = F.safetensors_file(ck / "model_100.safetensors")
        bad = _raw_safetensors(ck / "model_200.safetensors", _w([0, 16]), b"\0" * 16, n=1_000_000)
        name = bad.name
    else:
        good = F.hf_folder(ck, 100)
        bad = F.hf_folder(ck, 200)
        st = bad / "model.safetensors"
        st.write_bytes(struct.pack("<Q", 1_000_000) + st.read_bytes()[8:])
        F.old_mtime(bad)
        name = "model.safetensors"
    svc = _svc(tmp_path)
    outcome = choose(svc, "restart", None, overlap=True)
    assert outcome.choice is not None and outcome.choice.path == good, outcome
    assert not outcome.choice.verify_pending or outcome.choice.path == good
    assert [q.source for q in outcome.quarantined] == [bad], outcome.quarantined
    why = outcome.quarantined[0].reason
    assert name in why and "1000000" in why, why
    assert not bad.exists() and (ck / "quarantine" / bad.name).exists(), "moved, never deleted"


# ---------------------------------------------------------------- 2. a load test that cannot run

@pytest.fixture(scope="module")
def no_torch_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A real python of the job's kind with no torch: a venv without pip or site packages."""
    venv = tmp_path_factory.mktemp("nt") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    cp = subprocess.run([py, "-c", "import torch"], capture_output=True, text=True, timeout=60)
    assert cp.returncode != 0 and "No module named 'torch'" in cp.stderr, "torch must really be absent"
    return py


def _two_torch_files(tmp_path: Path) -> tuple[Path, Path]:
    return (F.torch_file(tmp_path / "ck" / "step_100.pt", 100), F.torch_file(tmp_path / "ck" / "step_200.pt", 200))


def _untested(logs: list[Any]) -> list[Any]:
    return [e for e in logs if e["event"] == "checkpoint_load_test_untested"]


@pytest.mark.parametrize("mode", ["restart", "rollback"])
def test_a_job_python_without_torch_quarantines_nothing(tmp_path: Path, no_torch_python: str, mode: str) -> None:
    old, new = _two_torch_files(tmp_path)
    hf = F.hf_folder(tmp_path / "ck", 150)
    svc = _svc(tmp_path, no_torch_python, expected_keys=("model",))
    with capture_logs() as logs:
        outcome = choose(svc, mode, 1000 if mode == "rollback" else None, overlap=False)
        rows = {r.path.name: r for r in svc.quicklist()}
    assert outcome.quarantined == (), outcome.quarantined
    assert outcome.choice is not None and outcome.choice.path == new, outcome
    assert old.exists() and new.exists() and hf.exists() and not (tmp_path / "ck" / "quarantine").exists()
    for name in ("step_100.pt", "step_200.pt", "checkpoint-150"):
        r = rows[name]
        assert r.ready and r.load_test is not None and r.load_test.untested, r
        assert any("not load-tested" in n and "torch" in n for n in r.notes), r.notes
        js = r.to_json()["load_test"]
        assert js["passed"] is False and "torch" in js["untested"], js
    said = _untested(logs)
    assert said, [e["event"] for e in logs]
    e = said[0]
    assert no_torch_python in str(e["python"]) and "torch" in str(e["reason"]), e
    assert "[checkpoints] python" in str(e["next"]) and "quarantine" in str(e["next"]), e
    assert len(said) == 1, "said once for the interpreter, not once per checkpoint"
    assert not any(e["event"] == "checkpoint_quarantined" for e in logs)


def test_overlap_with_a_python_without_torch_keeps_the_job_on_its_checkpoint(tmp_path: Path,
                                                                              no_torch_python: str) -> None:
    _, new = _two_torch_files(tmp_path)
    svc = _svc(tmp_path, no_torch_python)
    outcome = choose(svc, "restart", None, overlap=True)
    assert outcome.choice is not None and outcome.choice.path == new and outcome.choice.verify_pending
    row = svc.verify_chosen(new, "file")
    assert row.ready and row.load_test is not None and row.load_test.untested, row
    assert new.exists() and not (tmp_path / "ck" / "quarantine").exists()


def test_a_missing_interpreter_or_one_that_dies_is_not_a_verdict(tmp_path: Path) -> None:
    _, new = _two_torch_files(tmp_path)
    dies = tmp_path / "python3"
    dies.write_text("#!/bin/sh\nkill -9 $$\n")  # killed before any verdict (as by the OOM killer)
    dies.chmod(0o755)
    for python, words in ((str(tmp_path / "no" / "python3"), "cannot start"), (str(dies), "signal 9")):
        svc = _svc(tmp_path, python)
        outcome = choose(svc, "restart", None, overlap=False)
        assert outcome.quarantined == () and outcome.choice is not None and outcome.choice.path == new, outcome
        lt = svc.load_tests.cached(new)
        assert lt is not None and lt.untested and words in lt.untested, lt
        svc.close()
    assert not (tmp_path / "ck" / "quarantine").exists()
    # never persisted: a fixed environment (torch installed, [checkpoints] python set) tests again
    store = tmp_path / "state" / "checkpoint_loadtests.json"
    assert not store.exists() or not any(v.get("untested") for v in json.loads(store.read_text()).values())


def test_a_load_that_crashes_on_what_it_read_is_still_a_verdict(tmp_path: Path) -> None:
    """A segfault or SIGBUS (an mmap of a file cut short) ends the load itself: not "not tested"."""
    _, new = _two_torch_files(tmp_path)
    segv = tmp_path / "python3"
    segv.write_text("#!/bin/sh\nkill -SEGV $$\n")
    segv.chmod(0o755)
    svc = _svc(tmp_path, str(segv))
    lt = svc.load_tests.run(new, "file")
    assert not lt.passed and not lt.untested and "signal 11" in (lt.error or ""), lt
    assert not svc.evaluate(svc.scan()[0]).ready


# ---------------------------------------------------------------- 3. refused, never "passed"

MAKE_REFUSED = """
import json, os, sys, numpy as np, torch
from safetensors.torch import save_file
ck, marker = sys.argv[1], sys.argv[2]
class P:
    def __reduce__(self):
        return (os.system, ("touch " + marker,))
d = os.path.join(ck, "checkpoint-60")
os.makedirs(d)
save_file({"w": torch.ones(4)}, os.path.join(d, "model.safetensors"))
json.dump({"global_step": 60}, open(os.path.join(d, "trainer_state.json"), "w"))
np.save(os.path.join(d, "rng_state.npy"), np.array([P()], dtype=object), allow_pickle=True)
"""


def _refused_folder(tmp_path: Path) -> tuple[Path, Path]:
    ck, marker = tmp_path / "ck", tmp_path / "RAN"
    subprocess.run([sys.executable, "-c", MAKE_REFUSED, str(ck), str(marker)], check=True, timeout=120)
    F.old_mtime(ck / "checkpoint-60")
    return ck / "checkpoint-60", marker


def test_a_load_test_that_passed_on_a_refused_checkpoint_never_reads_as_passed(tmp_path: Path) -> None:
    d, marker = _refused_folder(tmp_path)
    svc = _svc(tmp_path)
    with capture_logs() as logs:
        rows = svc.quicklist()
    row = rows[0]
    assert not row.ready and row.reasons[0].startswith("pickle scan refused rng_state.npy"), row.reasons
    said = [e for e in logs if e["event"] == "checkpoint_load_test" and e["path"] == str(d)]
    assert said and all(e["passed"] is False and "pickle scan refused rng_state.npy" in str(e["refused"])
                        for e in said), said
    js = row.to_json()["load_test"]
    assert js["passed"] is False and js["refused"] == row.reasons[0] and js["error"] == row.reasons[0], js
    table = render_table(rows)
    assert "refused" in table.splitlines()[1] and "ok " not in table.splitlines()[1], table
    assert d.exists() and not marker.exists()


def test_the_report_shows_a_remembered_load_test_of_a_refused_checkpoint_as_refused(tmp_path: Path) -> None:
    from supervisor.report.collect import _with_verdict

    d, marker = _refused_folder(tmp_path)
    svc = _svc(tmp_path)
    svc.quicklist()  # the load test ran and is remembered; the report's row has none of its own
    row = _with_verdict({"path": str(d), "load_test": None, "ready": False, "reasons": ["x"]}, svc)
    lt = row["load_test"]
    assert lt["passed"] is False and lt["refused"].startswith("pickle scan refused rng_state.npy"), row
    assert not marker.exists()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", *args], cwd=str(ROOT), capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
def test_the_checkpoints_verb_and_the_report_say_refused(tmp_path: Path) -> None:
    from tests.checkpoints.test_scan_verdict import report_html

    d, marker = _refused_folder(tmp_path)
    sd = tmp_path / "state"
    sd.mkdir()
    cp = _cli("checkpoints", "--checkpoint-dir", str(d.parent), "--state-dir", str(sd), "--json")
    assert cp.returncode == 0, cp.stderr
    (row,) = json.loads(cp.stdout)
    assert row["ready"] is False and row["load_test"]["passed"] is False, row
    assert row["load_test"]["refused"].startswith("pickle scan refused rng_state.npy"), row
    cp = _cli("checkpoints", "--checkpoint-dir", str(d.parent), "--state-dir", str(sd))
    assert cp.returncode == 0 and "refused" in cp.stdout.splitlines()[1], cp.stdout
    # the report reads the verdict the verb left (no load test of its own)
    html = report_html(tmp_path, sd, d.parent)
    tr = next(line for line in html.split("<tr>") if "checkpoint-60</td>" in line)
    cells = tr.split("</td>")
    assert "fail" in cells[2] and "pass" not in cells[7] and "pickle scan refused rng_state.npy" in cells[8], tr
    assert not marker.exists()
    assert os.path.isdir(d)
