"""The cheap structural checks a restart trusts before the load test has run (issue 11):
real torch and safetensors files, whole, cut short, or missing a member."""
from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

import torch

from supervisor.checkpoints.structure import structure_problem


def _torch(path: Path) -> Path:
    torch.save({"model": {"w": torch.randn(1000)}, "iter_num": 5}, path)
    return path


def test_a_whole_torch_file_passes_and_one_cut_short_anywhere_does_not(tmp_path):
    p = _torch(tmp_path / "ckpt.pt")
    assert structure_problem(p) is None
    data = p.read_bytes()
    for cut in (len(data) // 3, len(data) - 10):
        p.write_bytes(data[:cut])
        assert "not whole" in structure_problem(p) or "past the end" in structure_problem(p)


def test_a_zip_that_lost_a_member_passes_here_and_is_left_to_the_load_test(tmp_path):
    src = _torch(tmp_path / "a.pt")
    dst = tmp_path / "b.pt"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for i in zin.infolist():
            if not i.filename.endswith("/data/0"):
                zout.writestr(i, zin.read(i))
    assert structure_problem(dst) is None


def test_safetensors_header_and_tensor_ranges_must_fit_the_file(tmp_path):
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    p = tmp_path / "model.safetensors"
    p.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 16)
    assert structure_problem(p) is None
    p.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    assert "past the end" in structure_problem(p)
    p.write_bytes(struct.pack("<Q", 10_000) + header)
    assert "header" in structure_problem(p)


def test_what_is_not_a_container_we_know_passes(tmp_path):
    legacy = tmp_path / "old.pt"
    legacy.write_bytes(b"\x80\x02not a zip")  # a legacy pickle: only the load test can say
    assert structure_problem(legacy) is None
    assert structure_problem(tmp_path) is None  # a folder
