"""A DCP save's byte items pass the pickle scan (issue 34, checkpoint safety): DCP's
FileSystemWriter writes every non-tensor item (a BytesIO: param groups, rng and dataloader states,
any object the job saves) as torch.save's bytes inside a ``*.distcp`` file, and its reader
``torch.load``s them with ``weights_only=False`` on resume. The scan reads each one where
``.metadata`` places it (checkpoints/dcpscan.py); tensor items are raw bytes, skipped. Real saves
made by torch in a subprocess: a clean one is ready, one with an ``os.system`` item is refused
with the item named, through the real `checkpoints` verb. Then hostile metadata, each past its
bound: refused with a reason, in bounded memory and time, a FIFO never opened blocking."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from supervisor.checkpoints import dcpscan
from supervisor.checkpoints.picklescan import scan_refusal
from tests.conftest import ROOT
from tests.helpers.ckpt_factory import old_mtime
from tests.test_child_budgets import peak_of

SAVE = """
import os, sys, warnings, torch
import torch.distributed.checkpoint as dcp
warnings.simplefilter("ignore")
out, marker, bad = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
class Payload:
    def __reduce__(self):
        return (os.system, ("touch " + marker,))
state = {"model": {"w": torch.ones(64), "b": torch.zeros(8)}, "step": 7,
         "optim": {"lr": 0.1, "betas": (0.9, 0.99), "rng": torch.get_rng_state()}}
if bad:
    state["optim"]["evil"] = Payload()
dcp.save(state, checkpoint_id=out)
if bad:  # DCP's own load runs it: the reason this scan exists (the marker removed after)
    got = {"model": {"w": torch.zeros(64), "b": torch.ones(8)}, "step": 0,
           "optim": {"lr": 0.0, "betas": (0, 0), "rng": torch.get_rng_state(), "evil": None}}
    dcp.load(got, checkpoint_id=out)
    assert os.path.exists(marker), "DCP's load did not run the payload"
    os.remove(marker)
"""


def _save(folder: Path, marker: Path, bad: bool) -> Path:
    subprocess.run([sys.executable, "-c", SAVE, str(folder), str(marker), "1" if bad else "0"], check=True,
                   timeout=180, capture_output=True)
    old_mtime(folder)
    return folder


@pytest.mark.slow
def test_a_dcp_byte_item_that_runs_code_is_refused_and_a_clean_save_is_ready(tmp_path: Path) -> None:
    ck, sd, marker = tmp_path / "ck", tmp_path / "state", tmp_path / "RAN"
    sd.mkdir()
    _save(ck / "step-10", marker, bad=False)
    _save(ck / "step-20", marker, bad=True)
    assert scan_refusal(ck / "step-10") is None
    got = scan_refusal(ck / "step-20")
    assert got is not None and got.file == "__0_0.distcp" and "[optim.evil]" in got.why, got
    assert "posix.system" in got.why and "runs code" in got.why
    cp = subprocess.run([sys.executable, "-m", "supervisor", "checkpoints", "--checkpoint-dir", str(ck),
                         "--state-dir", str(sd), "--json"], cwd=str(ROOT), capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0, cp.stderr
    rows = {Path(r["path"]).name: r for r in json.loads(cp.stdout)}
    assert rows["step-10"]["ready"] and rows["step-10"]["load_test"]["passed"], rows["step-10"]
    bad = rows["step-20"]
    assert bad["ready"] is False and bad["load_test"]["loaded"], bad  # the load test alone would pass it
    assert bad["load_test"]["passed"] is False and bad["load_test"]["refused"], bad  # and it is not read as a pass
    assert bad["reasons"][0].startswith("pickle scan refused __0_0.distcp: [optim.evil]:"), bad["reasons"]
    assert not marker.exists(), "the payload ran"


# ---------------------------------------------------------------- hostile metadata

# DCP's classes under their own names, without torch: what a hostile .metadata can say.
FAKE = """
import pickle, sys, types
from dataclasses import dataclass
def module(name):
    m = types.ModuleType(name); sys.modules[name] = m; return m
meta, fs = module("torch.distributed.checkpoint.metadata"), module("torch.distributed.checkpoint.filesystem")
def put(m, cls):
    cls.__module__ = m.__name__; setattr(m, cls.__name__, cls); return cls
@dataclass
class Metadata:
    state_dict_metadata: dict
    planner_data: object = None
    storage_data: object = None
@dataclass
class BytesStorageMetadata:
    pass
@dataclass(frozen=True)
class MetadataIndex:
    fqn: str
    offset: object = None
    index: object = None
@dataclass
class _StorageInfo:
    relative_path: str
    offset: int
    length: int
for c in (Metadata, BytesStorageMetadata, MetadataIndex):
    put(meta, c)
put(fs, _StorageInfo)
out, n, rel, offset, length = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
b = BytesStorageMetadata()
md = Metadata({f"i{k}": b for k in range(n)},
              storage_data={MetadataIndex(f"i{k}"): _StorageInfo(rel, offset, length) for k in range(n)})
with open(out, "wb") as f:
    pickle.dump(md, f, protocol=4)
"""


def _fake(folder: Path, n: int = 1, rel: str = "__0_0.distcp", offset: int = 0, length: int = 4) -> Path:
    folder.mkdir(exist_ok=True)
    subprocess.run([sys.executable, "-c", FAKE, str(folder / ".metadata"), str(n), rel, str(offset), str(length)],
                   check=True, timeout=300)
    (folder / "__0_0.distcp").write_bytes(b"\x80\x04K\x01.")  # a pickle of 1: harmless
    return folder


def _timed(fn):  # (value, peak traced bytes, seconds)
    t0 = time.monotonic()
    value, peak = peak_of(fn)
    return value, peak, time.monotonic() - t0


def test_a_stood_in_metadata_is_read_and_its_items_judged(tmp_path: Path) -> None:
    """The stand-ins read a metadata made without torch: a harmless item passes, so the refusals
    below are the bounds', not a parse that fails on everything."""
    assert scan_refusal(_fake(tmp_path / "ok", length=5)) is None


@pytest.mark.slow
def test_an_item_past_the_end_or_outside_the_folder_or_a_fifo_is_refused(tmp_path: Path) -> None:
    got = scan_refusal(_fake(tmp_path / "eof", offset=10**12, length=5))
    assert got is not None and "past the file's end (5 bytes)" in got.why and "not called checked" in got.why, got
    got = scan_refusal(_fake(tmp_path / "out", rel="../secret.distcp", length=5))
    assert got is not None and "outside the folder" in got.why, got
    fifo = _fake(tmp_path / "fifo", rel="pipe.distcp", length=5)
    os.mkfifo(fifo / "pipe.distcp")  # nobody writes to it: a blocking open would wait for good
    got, _, took = _timed(lambda: scan_refusal(fifo))
    assert got is not None and "not a regular file" in got.why and took < 10, (got, took)


def test_a_garbled_or_huge_metadata_is_refused_in_bounded_memory(tmp_path: Path) -> None:
    garbled = tmp_path / "garbled"
    garbled.mkdir()
    (garbled / ".metadata").write_bytes(b"\x80\x04" + os.urandom(4096))
    (garbled / "__0_0.distcp").write_bytes(b"x")
    got = scan_refusal(garbled)
    assert got is not None and got.file == ".metadata" and "not called checked" in got.why, got
    huge = tmp_path / "huge"
    huge.mkdir()
    with open(huge / ".metadata", "wb") as f:  # 100x the metadata bound, sparse
        f.write(b"\x80\x04\x95")
        f.truncate(100 * dcpscan.MAX_METADATA_BYTES)
    got, peak, took = _timed(lambda: scan_refusal(huge))
    assert got is not None and got.file == ".metadata" and "not called checked" in got.why, got
    assert peak < 8 << 20 and took < 30, (peak, took)


@pytest.mark.slow
def test_millions_of_items_are_refused_within_the_bound(tmp_path: Path) -> None:
    """1.5 million byte items (a 134 MB metadata): the size bound (128 MiB) refuses it before a
    byte is walked or a single object is built; each later bound is shown by lowering it."""
    many = _fake(tmp_path / "many", n=1_500_000, length=5)
    got, peak, took = _timed(lambda: scan_refusal(many))
    assert got is not None and got.file == ".metadata" and "not called checked" in got.why, got
    assert peak < 64 << 20 and took < 60, (peak, took)


def test_the_item_bounds_refuse_what_they_do_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _fake(tmp_path / "few", n=20, length=5)
    assert scan_refusal(folder) is None
    monkeypatch.setattr(dcpscan, "MAX_BYTE_ITEMS", 10)
    got = scan_refusal(folder)
    assert got is not None and "more than 10 byte items" in got.why, got
    monkeypatch.setattr(dcpscan, "MAX_BYTE_ITEMS", 10_000)
    monkeypatch.setattr(dcpscan, "MAX_ITEMS", 10)
    got = scan_refusal(folder)
    assert got is not None and "more than 10 items" in got.why, got
    monkeypatch.setattr(dcpscan, "MAX_ITEMS", 1_000_000)
    monkeypatch.setattr(dcpscan, "MAX_ITEM_BYTES", 50)
    got = scan_refusal(folder)
    assert got is not None and "byte items of more than 0 MiB in all" in got.why, got
