"""The pickle scan runs once a checkpoint version (issue 34: a large checkpoint costs seconds a
scan, and every ``evaluate`` and every overlap hand-over asked again): its verdict is remembered
while the identity of everything it read is unchanged (checkpoints/scancache.py). Shown through
the real service: a second evaluate does not scan again, a file rewritten in place or replaced, a
file added to the folder, is scanned again; a refusal is remembered as a pass is, a transient one
is not; the memory holds ``MAX_CACHED`` checkpoints at most."""
from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

import pytest

from supervisor.checkpoints import dcpscan, scancache
from supervisor.checkpoints.config import CheckpointsConfig
from supervisor.checkpoints.scancache import cached_refusal, scans_run
from supervisor.checkpoints.service import CheckpointService
from tests.checkpoints.test_dcp_byte_items import _fake
from tests.helpers import ckpt_factory as F

EVIL = b"\x80\x04\x8c\x02os\x8c\x06system\x93\x8c\x04true\x85R."  # os.system("true"): never run here


def _service(tmp_path: Path) -> CheckpointService:
    (tmp_path / "state").mkdir(exist_ok=True)
    cfg = CheckpointsConfig(settle_s=0.01, load_test=False)
    return CheckpointService(cfg, tmp_path / "ck", tmp_path / "state", sys.executable, ["python", "train.py"], tmp_path)


def _rows(svc: CheckpointService) -> dict[str, tuple[bool, list[str]]]:
    return {c.path.name: ((row := svc.evaluate(c)).ready, list(row.reasons)) for c in svc.scan()}


def test_a_second_evaluate_does_not_scan_again_and_a_changed_file_is(tmp_path: Path) -> None:
    good = F.torch_file(tmp_path / "ck" / "step_100.pt", 100)
    F.old_mtime(good)
    svc = _service(tmp_path)
    before = scans_run()
    first = _rows(svc)
    assert first["step_100.pt"][0], first
    assert scans_run() == before + 1
    assert _rows(svc) == first and scans_run() == before + 1, "scanned again, unchanged"
    # Rewritten in place with a payload, same size and mtime as before: its ctime changed.
    st = good.stat()
    data = good.read_bytes()
    with open(good, "r+b") as f:
        f.write(EVIL + data[len(EVIL):])
    os.utime(good, ns=(st.st_atime_ns, st.st_mtime_ns))
    again = _rows(svc)
    assert scans_run() == before + 2, "a rewritten file was not scanned again"
    assert not again["step_100.pt"][0] and again["step_100.pt"][1][0].startswith("pickle scan refused"), again
    # The refusal is remembered as a pass is.
    assert _rows(svc) == again and scans_run() == before + 2


def test_a_folder_is_scanned_again_when_its_listing_or_a_file_changes(tmp_path: Path) -> None:
    folder = _fake(tmp_path / "dcp", n=3, length=5)
    before = scans_run()
    assert cached_refusal(folder) is None and cached_refusal(folder) is None
    assert scans_run() == before + 1
    (folder / "extra.pkl").write_bytes(EVIL)  # a new file in the listing
    got = cached_refusal(folder)
    assert got is not None and got.file == "extra.pkl" and scans_run() == before + 2, got
    (folder / "extra.pkl").unlink()
    assert cached_refusal(folder) is None and scans_run() == before + 3
    tmp = folder / "__0_0.distcp.tmp"  # a byte item's file replaced by rename: a new inode
    tmp.write_bytes(EVIL)
    tmp.replace(folder / "__0_0.distcp")
    got = cached_refusal(folder)
    assert got is not None and got.file == "__0_0.distcp" and "[i0]" in got.why, got  # its 5 bytes: a cut pickle
    assert scans_run() == before + 4


def test_a_transient_refusal_is_not_remembered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _fake(tmp_path / "dcp", n=3, length=5)
    monkeypatch.setattr(dcpscan, "CHILD_TIMEOUT_S", 0.001)  # a loaded machine: the reader past its deadline
    before = scans_run()
    got = cached_refusal(folder)
    assert got is not None and got.transient and "not called checked yet" in got.why, got
    monkeypatch.setattr(dcpscan, "CHILD_TIMEOUT_S", 180.0)
    assert cached_refusal(folder) is None and scans_run() == before + 2


def test_the_memory_holds_a_bounded_number_of_checkpoints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scancache, "MAX_CACHED", 2)
    paths = []
    for i in range(3):
        p = tmp_path / f"s{i}.pkl"
        p.write_bytes(pickle.dumps({"step": i}))
        paths.append(p)
    before = scans_run()
    for p in paths:
        assert cached_refusal(p) is None
    assert cached_refusal(paths[2]) is None and cached_refusal(paths[1]) is None and scans_run() == before + 3
    assert cached_refusal(paths[0]) is None and scans_run() == before + 4, "the least recently asked for is forgotten"
    assert len(scancache._CACHE._verdicts) <= 2
