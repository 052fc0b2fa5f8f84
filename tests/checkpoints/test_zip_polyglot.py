"""Issue 34 D1: the pickle scan reads the archive torch's reader reads, or refuses it.

Python's zipfile corrects a zip's offsets for data in front of it; torch's reader (miniz) takes
them as absolute. Two torch zips of one length glued together were two archives: the scan read the
second (harmless), torch loaded the first (a payload). Each shape below that lets two readers see
two archives is refused as "not called checked"; real torch and numpy files still pass."""
from __future__ import annotations

import io
import os
import pickle
import struct
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from supervisor.checkpoints.picklescan import unsafe_pickle


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def _entries() -> list[tuple[str, bytes]]:
    buf = io.BytesIO()
    torch.save({"w": 1}, buf)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as z:
        return [(i.filename, z.read(i)) for i in z.infolist()]


def _zip(pkl: bytes, *, name: str = "data.pkl") -> bytes:
    """A torch zip (stored members, as torch writes them) whose data.pkl is ``pkl``."""
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w", zipfile.ZIP_STORED) as z:
        for member, data in _entries():
            if member.endswith("data.pkl"):
                member, data = member.replace("data.pkl", name), pkl
            z.writestr(zipfile.ZipInfo(member, date_time=(2020, 1, 1, 0, 0, 0)), data)
    return b.getvalue()


def _pair(marker: Path) -> tuple[bytes, bytes]:
    """Two torch zips of one length: A's data.pkl runs ``touch marker``, B's is plain data."""
    evil = pickle.dumps({"w": _Payload(marker)}, protocol=2)
    good = pickle.dumps({"w": 1, "pad": ""}, protocol=2)
    good = pickle.dumps({"w": 1, "pad": "x" * (len(evil) - len(good))}, protocol=2)
    a, b = _zip(evil), _zip(good)
    assert len(a) == len(b)
    return a, b


def _refused(path: Path, words: str) -> None:
    why = unsafe_pickle(path)
    assert why is not None and "not called checked" in why and words in why, why


def test_a_polyglot_of_two_torch_zips_is_refused_and_torch_would_read_the_first(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    a, b = _pair(marker)
    poly = tmp_path / "poly.pt"
    poly.write_bytes(a + b)
    # zipfile alone (the scan's reader before) sees only B: plain data.
    with zipfile.ZipFile(poly) as z:
        assert b"pad" in z.read("archive/data.pkl")
    # torch's reader loads A: weights_only names A's os.system (and so refuses it); B would load.
    with pytest.raises(pickle.UnpicklingError, match="system"):
        torch.load(poly, weights_only=True)
    _refused(poly, "a zip with data before its archive: another reader (torch's) may see another archive")
    (tmp_path / "b.pt").write_bytes(b)
    assert unsafe_pickle(tmp_path / "b.pt") is None, "B alone is a whole, harmless torch zip"
    assert not marker.exists()


def test_junk_before_or_after_an_archive_is_refused(tmp_path: Path) -> None:
    good = _zip(pickle.dumps({"w": 1}, protocol=2))
    (tmp_path / "junk_byte.pt").write_bytes(b"\x00" + good)  # torch reads it as pickles: not one
    _refused(tmp_path / "junk_byte.pt", "cannot be read")
    (tmp_path / "trailing.pt").write_bytes(good + b"x")
    _refused(tmp_path / "trailing.pt", "bytes after its end record")
    # Data before the archive with offsets made absolute (zipfile's append to a file that is no
    # zip): the hidden local entry in front is one more archive for a reader that scans forward.
    front = tmp_path / "front.pt"
    front.write_bytes(_zip(pickle.dumps({"w": _Payload(tmp_path / "ran")}, protocol=2))[:200])
    with zipfile.ZipFile(front, "a", zipfile.ZIP_STORED) as z:
        for member, data in _entries():
            z.writestr(member, data)
    _refused(front, "data before its archive")


def _patched(data: bytes, at: int, new: bytes) -> bytes:
    return data[:at] + new + data[at + len(new):]


def test_members_that_overlap_or_disagree_with_their_local_headers_are_refused(tmp_path: Path) -> None:
    good = _zip(pickle.dumps({"w": 1}, protocol=2))
    with zipfile.ZipFile(io.BytesIO(good)) as z:
        infos = z.infolist()
    cd = good.index(b"PK\x01\x02")
    second_cd = good.index(b"PK\x01\x02", cd + 4)
    cases = {
        # The second directory entry points at the first member's local header.
        "overlap.pt": (_patched(good, second_cd + 42, struct.pack("<I", 0)), "overlap"),
        # The local header names another member than the directory does.
        "name.pt": (_patched(good, 30, b"x"), "names another member"),
        # The local header states other sizes (a stored member written without a data descriptor).
        "sizes.pt": (_patched(good, 18, struct.pack("<I", infos[0].compress_size + 1)), "sizes disagree"),
    }
    for name, (data, words) in cases.items():
        (tmp_path / name).write_bytes(data)
        _refused(tmp_path / name, words)


def test_two_members_of_one_name_ignoring_case_are_refused_and_an_upper_case_pkl_is_read(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    evil = pickle.dumps({"w": _Payload(marker)}, protocol=2)
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w") as z:  # miniz finds a member ignoring case: either may be loaded
        z.writestr("archive/data.pkl", pickle.dumps({"w": 1}, protocol=2))
        z.writestr("archive/DATA.pkl", evil)
    (tmp_path / "twins.pt").write_bytes(b.getvalue())
    _refused(tmp_path / "twins.pt", "two members of one name")
    (tmp_path / "upper.pt").write_bytes(_zip(evil, name="DATA.PKL"))
    why = unsafe_pickle(tmp_path / "upper.pt")
    assert why is not None and "DATA.PKL" in why and "system" in why, why
    assert not marker.exists()


def test_a_zip64_locator_pointing_away_from_its_record_is_refused(tmp_path: Path) -> None:
    buf = io.BytesIO()
    torch.save({"w": torch.ones(3)}, buf)  # torch always writes the zip64 end records
    data = buf.getvalue()
    loc = data.rindex(b"PK\x06\x07")
    (z64,) = struct.unpack("<Q", data[loc + 8:loc + 16])
    (tmp_path / "loc.pt").write_bytes(_patched(data, loc + 8, struct.pack("<Q", z64 - 1)))
    _refused(tmp_path / "loc.pt", "zip64 locator")


def test_real_torch_numpy_and_safetensors_files_still_pass(tmp_path: Path) -> None:
    torch.save({"model": torch.nn.Linear(3, 2).state_dict(), "step": 3}, tmp_path / "model.pt")
    torch.save({f"p{i}": torch.ones(2) for i in range(2000)}, tmp_path / "many.pt")
    np.savez(tmp_path / "a.npz", x=np.ones(3), y=np.arange(4))
    np.savez_compressed(tmp_path / "b.npz", x=np.ones(3))
    from safetensors.torch import save_file
    save_file({"w": torch.ones(2, 2)}, str(tmp_path / "model.safetensors"))
    for name in ("model.pt", "many.pt", "a.npz", "b.npz", "model.safetensors"):
        assert unsafe_pickle(tmp_path / name) is None, name
    assert unsafe_pickle(tmp_path) is None


def test_an_npz_polyglot_is_refused_too(tmp_path: Path) -> None:
    """np.load reads with zipfile as the scan does, so both see B; refused all the same (no
    honest np.savez has data before its archive)."""
    a, b = io.BytesIO(), io.BytesIO()
    np.savez(a, x=np.ones(4))
    np.savez(b, x=np.zeros(4))
    (tmp_path / "poly.npz").write_bytes(a.getvalue() + b.getvalue())
    _refused(tmp_path / "poly.npz", "data before its archive")


def test_a_legacy_tar_with_two_members_of_one_name_is_refused(tmp_path: Path) -> None:
    """torch's legacy tar reader takes the last member of a name; no honest save has two."""
    marker = tmp_path / "ran"
    members = [("storages", pickle.dumps(0, protocol=2) + pickle.dumps([], protocol=2)),
               ("tensors", pickle.dumps(0, protocol=2)),
               ("pickle", pickle.dumps({"w": _Payload(marker)}, protocol=2)),
               ("pickle", pickle.dumps({"w": 1}, protocol=2))]
    with tarfile.open(tmp_path / "old.tar", "w:", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    _refused(tmp_path / "old.tar", "two members named 'pickle'")
    assert not marker.exists()
