"""A safetensors checkpoint the safetensors library refuses is never shown ready (issue 34, R4):
the structural check applies the library's own rules (each tensor's shape x dtype size is its
byte range; the ranges tile the data section: no overlap, no gap, nothing after the last), and
the load test opens every safetensors file it finds with the job's safetensors library, alone or
in an HF folder. Through the `checkpoints` verb, on real files."""
from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.numpy import load_file

from supervisor.checkpoints.structure import structure_problem
from tests.conftest import ROOT
from tests.helpers import ckpt_factory as f

F32x2 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
BAD = {  # name -> (header, data section): each one refused by safetensors.load_file
    "shape": ({"w": {"dtype": "F32", "shape": [1000], "data_offsets": [0, 8]}}, 8),
    "overlap": ({"a": F32x2, "b": F32x2}, 8),
    "gap": ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}, 16),
    "tail": ({"w": F32x2}, 16),
}


def write(path: Path, header: dict, data: int) -> Path:
    h = json.dumps(header).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"\0" * data)
    f.old_mtime(path)
    return path


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", "checkpoints", *args], cwd=str(ROOT),
                          capture_output=True, text=True, timeout=120)


def rows(tmp_path: Path, ck: Path) -> dict[str, dict]:
    cp = cli("--checkpoint-dir", str(ck), "--state-dir", str(tmp_path / "state"), "--json")
    assert cp.returncode == 0, cp.stderr
    return {Path(r["path"]).name: r for r in json.loads(cp.stdout)}


@pytest.mark.parametrize("case", sorted(BAD))
def test_what_the_library_refuses_the_structural_check_refuses(tmp_path, case):
    p = write(tmp_path / f"{case}.safetensors", *BAD[case])
    with pytest.raises(Exception):  # noqa: B017 - the library's own refusal, whatever its class
        load_file(p)
    why = structure_problem(p)
    assert why and why.startswith(f"{case}.safetensors: ") and "corrupt" in why
    good = write(tmp_path / "good.safetensors", {"a": F32x2, "b": {"dtype": "BF16", "shape": [2, 2],
                                                                   "data_offsets": [8, 16]}}, 16)
    assert structure_problem(good) is None


def test_the_reasons_name_the_tensor_and_the_bytes(tmp_path):
    assert "'w' is F32 of shape [1000] (more than 8 bytes) but its data_offsets give it 8 bytes" in \
        structure_problem(write(tmp_path / "s.safetensors", *BAD["shape"]))
    assert "'b' at bytes 0-8 of the data section overlaps" in \
        structure_problem(write(tmp_path / "o.safetensors", *BAD["overlap"]))
    assert "leaves bytes 0-8 unused" in structure_problem(write(tmp_path / "g.safetensors", *BAD["gap"]))
    # a shape of absurd dims is refused without building a huge number
    huge = {"w": {"dtype": "F32", "shape": [10**18] * 10_000, "data_offsets": [0, 8]}}
    assert "more than 8 bytes" in structure_problem(write(tmp_path / "h.safetensors", huge, 8))


def test_an_unknown_dtype_is_left_to_the_library_but_its_range_is_still_checked(tmp_path):
    # A newer format's dtype may be known to the job's own safetensors: not judged by size here.
    p = write(tmp_path / "u.safetensors", {"w": {"dtype": "F3_NEW", "shape": [1000], "data_offsets": [0, 8]}}, 8)
    assert structure_problem(p) is None
    p = write(tmp_path / "u.safetensors", {"w": {"dtype": "F3_NEW", "shape": [2], "data_offsets": [0, 8]},
                                           "v": {"dtype": "F3_NEW", "shape": [2], "data_offsets": [0, 8]}}, 8)
    assert "overlaps" in structure_problem(p)


def test_a_header_of_many_tensors_is_checked_in_one_sort(tmp_path):
    n = 200_000
    header = {f"t{i}": {"dtype": "F16", "shape": [1], "data_offsets": [2 * i, 2 * i + 2]} for i in range(n)}
    # listed in reverse order: only a sort makes them tile
    p = write(tmp_path / "many.safetensors", dict(reversed(header.items())), 2 * n)
    t0 = time.process_time()
    assert structure_problem(p) is None
    header[f"t{n - 1}"]["data_offsets"] = [0, 2]
    write(p, header, 2 * n)
    assert "overlaps" in structure_problem(p)
    assert time.process_time() - t0 < 20  # about 1 s here; a pairwise check would take hours


def test_checkpoints_verb_never_shows_a_refused_safetensors_file_ready(tmp_path):
    ck = tmp_path / "ck"
    for case, (header, data) in BAD.items():
        write(ck / f"model_{case}.safetensors", header, data)
    f.safetensors_file(ck / "model_good.safetensors")
    got = rows(tmp_path, ck)
    for case in BAD:
        r = got[f"model_{case}.safetensors"]
        assert r["ready"] is False and any("corrupt" in x for x in r["reasons"]), r
        assert not (r["load_test"] or {}).get("passed"), r
    good = got["model_good.safetensors"]
    assert good["ready"] is True and good["load_test"]["passed"] is True, good


def test_an_hf_folder_whose_model_safetensors_overlaps_is_not_ready(tmp_path):
    ck = tmp_path / "ck"
    f.hf_folder(ck, 100)
    bad = f.hf_folder(ck, 200)
    write(bad / "model.safetensors", *BAD["overlap"])
    f.old_mtime(bad)
    got = rows(tmp_path, ck)
    assert got["checkpoint-100"]["ready"] is True, got["checkpoint-100"]
    r = got["checkpoint-200"]
    assert r["ready"] is False and any("model.safetensors" in x and "overlaps" in x for x in r["reasons"]), r


def test_the_load_test_opens_safetensors_with_the_library(tmp_path):
    # An unknown dtype passes the structural check (not judged there); the job's library refuses
    # it, so the load test fails: alone and in an HF folder.
    ck = tmp_path / "ck"
    unknown = {"w": {"dtype": "F3_NEW", "shape": [2], "data_offsets": [0, 8]}}
    write(ck / "model_1.safetensors", unknown, 8)
    d = f.hf_folder(ck, 300)
    write(d / "model.safetensors", unknown, 8)
    f.old_mtime(d)
    got = rows(tmp_path, ck)
    for name in ("model_1.safetensors", "checkpoint-300"):
        r = got[name]
        assert r["ready"] is False and r["load_test"]["passed"] is False, r
        assert "F3_NEW" in r["load_test"]["error"] or "deserializ" in r["load_test"]["error"], r
    assert "model.safetensors" in got["checkpoint-300"]["load_test"]["error"]


def test_without_safetensors_in_the_jobs_python_the_file_is_not_tested(tmp_path):
    ck = tmp_path / "ck"
    f.safetensors_file(ck / "model_5.safetensors")
    blocker = tmp_path / "block" / "safetensors"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('no safetensors in this environment')\n")
    py = tmp_path / "python"
    py.write_text(f"#!/bin/sh\nPYTHONPATH={blocker.parent} exec {sys.executable} \"$@\"\n")
    py.chmod(0o755)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[job]\ncommand = ["python", "train.py"]\nworkdir = "{tmp_path}"\n'
                   f'[state]\ndir = "{tmp_path / "state"}"\n'
                   f'[checkpoints]\ndir = "{ck}"\npython = "{py}"\n')
    cp = cli("--config", str(cfg), "--json")
    assert cp.returncode == 0, cp.stderr
    (r,) = json.loads(cp.stdout)
    lt = r["load_test"]
    assert lt["passed"] is not True and "cannot import safetensors" in json.dumps(lt), r
