"""Issue 34 D6: the pickle scan reads inside numpy files and compressed pickles. An object array in a
``.npy`` (or an ``.npz`` member) is a pickle after its header, and ``np.load(..., allow_pickle=True)``
runs it; ``optimizer.pt.gz`` is a pickle a job reads through ``gzip``. Each hostile file is first shown
to run its payload when loaded carelessly (tests/helpers/hostile_numpy.py, real numpy in a subprocess
of the venv's Python), then refused by the scan; numeric arrays and plain data still pass."""
from __future__ import annotations

import gzip
import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from supervisor.checkpoints import npyscan, picklescan
from supervisor.checkpoints.picklescan import unsafe_pickle
from supervisor.checkpoints.picklestream import MAX_PICKLE_BYTES

HELPER = Path(__file__).resolve().parent.parent / "helpers" / "hostile_numpy.py"


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("hostile_numpy")
    subprocess.run([sys.executable, str(HELPER), str(out)], check=True, timeout=300)
    return out, json.loads((out / "index.json").read_text())


def test_each_hostile_numpy_or_compressed_file_runs_its_payload_and_is_refused(made: tuple[Path, dict[str, Any]]) -> None:
    out, index = made
    assert sorted(index) == ["arrays.npz", "arrays_compressed.npz", "object.npy", "optimizer.pt.gz", "rng_object.npy",
                             "state.pkl.bz2", "state.pkl.xz"]
    assert [k for k, v in index.items() if not v["ran"]] == [], "each runs its payload under a careless load"
    for name in index:
        why = unsafe_pickle(out / name)
        assert why is not None and why.startswith(name) and "posix.system" in why, (name, why)
    assert "arrays.npz:rng.npy:" in (unsafe_pickle(out / "arrays.npz") or "")  # the member is named
    assert not [v["marker"] for v in index.values() if Path(v["marker"]).exists()], "the scan never executes"


def test_numeric_arrays_an_rng_state_and_plain_compressed_data_pass(made: tuple[Path, dict[str, Any]]) -> None:
    out, _ = made
    good = sorted(p.name for p in out.glob("good_*"))
    assert good == ["good_arrays.npz", "good_arrays_compressed.npz", "good_numeric.npy", "good_optimizer.pt.gz",
                    "good_rng_state.npy", "good_structured.npy"]
    assert {n: unsafe_pickle(out / n) for n in good} == {n: None for n in good}


def test_a_folder_s_numpy_files_are_scanned_by_name(made: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    out, index = made
    folder = tmp_path / "step_40"
    (folder / "rng").mkdir(parents=True)
    for name in ("good_numeric.npy", "good_arrays.npz", "good_optimizer.pt.gz"):
        (folder / name).write_bytes((out / name).read_bytes())
    assert unsafe_pickle(folder) is None
    (folder / "rng" / "state.npy").write_bytes((out / "rng_object.npy").read_bytes())
    why = unsafe_pickle(folder)
    assert why is not None and why.startswith("rng/state.npy:") and "posix.system" in why, why
    assert not [v["marker"] for v in index.values() if Path(v["marker"]).exists()]


def test_an_object_array_of_arbitrary_objects_is_refused_even_without_a_payload(tmp_path: Path) -> None:
    # A Fraction runs no code, but an object array may rebuild only numpy's own arrays of plain values.
    job = ("import sys, fractions, numpy as np; "
           "np.save(sys.argv[1], np.array([fractions.Fraction(1, 2)], dtype=object))")
    subprocess.run([sys.executable, "-c", job, str(tmp_path / "f.npy")], check=True, timeout=60)
    why = unsafe_pickle(tmp_path / "f.npy")
    assert why is not None and "fractions.Fraction" in why, why


def _npy(header: bytes, version: int = 1) -> bytes:
    size = len(header).to_bytes(2 if version == 1 else 4, "little")
    return npyscan.NPY_MAGIC + bytes([version, 0]) + size + header


def test_what_a_numpy_or_compressed_reader_cannot_read_is_not_called_checked(tmp_path: Path) -> None:
    obj = b"{'descr': '|O', 'fortran_order': False, 'shape': (1,), }\n"
    cases = {
        "cut.npy": _npy(obj),  # an object array whose pickle is missing
        "header.npy": _npy(b"__import__('os').system('x')\n"),  # no literal: literal_eval never runs it
        "huge_header.npy": _npy(b"{'descr': '<f4', 'x': '" + b"a" * (npyscan.MAX_HEADER_BYTES + 10) + b"'}", 2),
        "version9.npy": _npy(obj, 9),
        "bad_descr.npy": _npy(b"{'descr': 3, 'fortran_order': False, 'shape': (1,)}\n"),
        "broken.pt.gz": b"\x1f\x8b\x08\x00" + bytes(30),
        "zip_inside.pt.gz": gzip.compress(b"PK\x03\x04" + bytes(100)),
        "empty.pkl.gz": gzip.compress(b""),
        "state.pkl.lz4": b"\x04\x22\x4d\x18" + bytes(20),
    }
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        why = unsafe_pickle(tmp_path / name)
        assert why is not None and why.startswith(name) and "not called checked" in why, (name, why)


def test_a_compression_bomb_is_not_called_checked_within_the_byte_budget(tmp_path: Path) -> None:
    # 80 MiB of pickle once decompressed, 80 KiB on disk: the budget counts decompressed bytes.
    path = tmp_path / "optimizer.pt.gz"
    with gzip.open(path, "wb") as f:
        size = MAX_PICKLE_BYTES + (16 << 20)
        f.write(b"\x80\x04\x8e" + size.to_bytes(8, "little"))  # BINBYTES8 of 80 MiB
        chunk = bytes(1 << 20)
        for _ in range(size >> 20):
            f.write(chunk)
        f.write(b".")
    assert path.stat().st_size < 1 << 20
    why = unsafe_pickle(path)
    assert why is not None and "64 MiB" in why and "not called checked" in why, why
    # The same stream within the budget is plain bytes: it passes.
    with gzip.open(path, "wb") as f:
        pickle.dump(bytes(1 << 20), f, protocol=4)
    assert unsafe_pickle(path) is None


def test_an_npz_of_too_many_members_is_not_called_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job = "import sys, numpy as np; np.savez(sys.argv[1], **{f'a{i}': np.zeros(1) for i in range(5)})"
    subprocess.run([sys.executable, "-c", job, str(tmp_path / "m.npz")], check=True, timeout=60)
    assert unsafe_pickle(tmp_path / "m.npz") is None
    monkeypatch.setattr(picklescan, "MAX_NPZ_MEMBERS", 4)
    why = unsafe_pickle(tmp_path / "m.npz")
    assert why is not None and "more than 4 .npy members" in why and "not called checked" in why, why
