"""A large DCP save is ready, its byte items still scanned (issue 34, never harm the run).

The byte items' places are read from ``.metadata`` by a child of the daemon's own interpreter
(``checkpoints/_dcpitems_script.py``, under an address-space limit and a deadline): in the daemon
its stand-ins cost ~3.5 KiB an entry, so the budget stopped at ~55,000 entries and a large FSDP
save (800 parameters x 3 optimizer states x 64 ranks = 153,600 entries) was not ready, the daemon
restarting from scratch or giving up over a healthy checkpoint. Shown here: a real ``dcp.save`` of
80,000 entries (past the old bound) ready through the verb; a ``.metadata`` made with torch's own
DCP classes for that FSDP shape, clean (passes) and with one rank's byte item an ``os.system``
payload (refused, the item named), the scanning process's peak RSS measured; the child's own
bounds (memory, deadline, output), each lowered to show what happens past it."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from supervisor.checkpoints import dcpscan
from supervisor.checkpoints.picklescan import scan_refusal
from tests.checkpoints.test_dcp_byte_items import _fake
from tests.conftest import ROOT
from tests.helpers.ckpt_factory import old_mtime

REAL = """
import sys, warnings, torch
import torch.distributed.checkpoint as dcp
warnings.simplefilter("ignore")
n = int(sys.argv[2])
dcp.save({"model": {f"layers.{i // 8}.block.p{i % 8}.weight": torch.zeros(2) for i in range(n)}, "step": 7},
         checkpoint_id=sys.argv[1])
"""

# torch's own DCP classes, laid out as FSDP saves them: every optimizer state of every parameter
# sharded over every rank (a chunk and a storage entry each), and a byte item a rank (its param
# groups, torch.save'd into that rank's .distcp as DCP's writer does). Written twice: clean, and
# with rank 37's item an os.system payload.
FSDP = """
import io, os, pickle, shutil, sys, torch
from torch.distributed.checkpoint.metadata import (Metadata, TensorStorageMetadata, BytesStorageMetadata,
    ChunkStorageMetadata, TensorProperties, MetadataIndex)
from torch.distributed.checkpoint.filesystem import _StorageInfo
root, params, states, ranks = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
class Payload:
    def __reduce__(self):
        return (os.system, ("touch " + os.path.join(root, "RAN"),))
def saved(obj):
    b = io.BytesIO(); torch.save(obj, b); return b.getvalue()
good = saved([{"lr": 0.1, "betas": (0.9, 0.99), "params": list(range(params))}])
evil = saved([{"lr": 0.1, "evil": Payload()}])
sdm, storage = {}, {}
for p in range(params):
    for s in range(states):
        fqn = f"optim.state.layers.{p // 8}.block.p{p % 8}.weight.s{s}"
        sdm[fqn] = TensorStorageMetadata(properties=TensorProperties(dtype=torch.float32),
            size=torch.Size([16 * ranks, 64]),
            chunks=[ChunkStorageMetadata(offsets=torch.Size([r * 16, 0]), sizes=torch.Size([16, 64])) for r in range(ranks)])
        for r in range(ranks):
            storage[MetadataIndex(fqn, torch.Size([r * 16, 0]), r)] = _StorageInfo(
                f"__{r}_0.distcp", 4096 + (p * states + s) * 4096, 4096)
for r in range(ranks):
    sdm[f"optim.param_groups.{r}"] = BytesStorageMetadata()
for name in ("clean", "bad"):
    for r in range(ranks):
        storage[MetadataIndex(f"optim.param_groups.{r}")] = _StorageInfo(
            f"__{r}_0.distcp", 0, len(evil if (name == "bad" and r == 37) else good))
    d = os.path.join(root, name); os.makedirs(d)
    with open(os.path.join(d, ".metadata"), "wb") as f:
        pickle.dump(Metadata(state_dict_metadata=sdm, storage_data=storage), f)
    for r in range(ranks):
        with open(os.path.join(d, f"__{r}_0.distcp"), "wb") as f:
            f.write(evil if (name == "bad" and r == 37) else good)
            f.truncate(4096 + params * states * 4096)  # the tensors' bytes: sparse, never read
print(len(storage))
"""

# The scan in a process of its own, as the daemon runs it: its verdict, time and peak RSS (the
# walk's memory), and the children's peak RSS (the child that read the stand-ins; forked from this
# small process, so its ru_maxrss is its own).
SCAN = """
import json, resource, sys, time
from pathlib import Path
from supervisor.checkpoints.picklescan import scan_refusal
t0 = time.monotonic()
got = scan_refusal(Path(sys.argv[1]))
# VmHWM, not ru_maxrss: that one keeps the pytest process's size from before the exec.
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"why": got and got.why, "file": got and got.file, "s": time.monotonic() - t0,
                  "rss_mib": hwm / 1024,
                  "child_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""


def _scanned(path: Path) -> dict[str, object]:
    cp = subprocess.run([sys.executable, "-c", SCAN, str(path)], cwd=str(ROOT), capture_output=True, text=True,
                        timeout=600, check=True)
    got: dict[str, object] = json.loads(cp.stdout.splitlines()[-1])
    print(path.name, got)  # the figures docs/reliability.md quotes
    return got


@pytest.mark.slow
def test_a_real_dcp_save_past_the_old_bound_is_ready(tmp_path: Path) -> None:
    """80,000 entries: 8.6 million opcodes, a 19 MB .metadata (the old bound: 6 million)."""
    ck, sd = tmp_path / "ck", tmp_path / "state"
    sd.mkdir()
    subprocess.run([sys.executable, "-c", REAL, str(ck / "step-10"), "80000"], check=True, timeout=600,
                   capture_output=True)
    old_mtime(ck / "step-10")
    got = _scanned(ck / "step-10")
    assert got["why"] is None, got
    assert isinstance(got["rss_mib"], float) and got["rss_mib"] < 200, got  # about 60 MiB here
    cp = subprocess.run([sys.executable, "-m", "supervisor", "checkpoints", "--checkpoint-dir", str(ck),
                         "--state-dir", str(sd), "--json"], cwd=str(ROOT), capture_output=True, text=True, timeout=600)
    assert cp.returncode == 0, cp.stderr
    (row,) = json.loads(cp.stdout)
    assert row["ready"] and not any("pickle scan" in r for r in row["reasons"]), row


@pytest.mark.slow
def test_an_fsdp_save_of_153600_entries_is_scanned_whole_in_bounded_memory(tmp_path: Path) -> None:
    cp = subprocess.run([sys.executable, "-c", FSDP, str(tmp_path), "800", "3", "64"], check=True, timeout=600,
                        capture_output=True, text=True)
    assert cp.stdout.split() == ["153664"], cp.stdout
    clean = _scanned(tmp_path / "clean")
    assert clean["why"] is None, clean
    bad = _scanned(tmp_path / "bad")
    assert bad["file"] == "__37_0.distcp", bad
    assert "[optim.param_groups.37]" in str(bad["why"]) and "posix.system" in str(bad["why"]), bad
    assert "runs code" in str(bad["why"]), bad
    # The daemon's side holds the walk (a 21 MB .metadata held whole): ~60-90 MiB here; the
    # child's stand-ins ~410 MiB, within its address-space limit and gone with it.
    for got in (clean, bad):
        assert isinstance(got["rss_mib"], float) and got["rss_mib"] < 200, got
        assert isinstance(got["child_rss_mib"], float) and got["child_rss_mib"] < dcpscan.CHILD_AS_BYTES >> 20, got
    assert not (tmp_path / "RAN").exists(), "the payload ran"


def test_the_child_locates_the_byte_items_of_a_stood_in_metadata(tmp_path: Path) -> None:
    folder = _fake(tmp_path / "few", n=3, length=5)
    assert dcpscan._byte_items(folder) == [(f"i{k}", "__0_0.distcp", 0, 5) for k in range(3)]


@pytest.mark.slow
def test_the_childs_memory_bound_refuses_what_it_cannot_hold(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """200,000 items (about 100 MiB of stand-ins) under a 200 MiB address space (a bare
    interpreter maps about 30): refused with the bound named, in the child, not the daemon."""
    folder = _fake(tmp_path / "many", n=200_000, length=5)
    monkeypatch.setattr(dcpscan, "CHILD_AS_BYTES", 96 << 20)
    got = dcpscan.scan_byte_items(folder, lambda f, where: None)
    assert got is not None and got.file == ".metadata" and "more than the 96 MiB its reader may use" in got.why, got
    assert "not called checked" in got.why and not got.transient, got
    monkeypatch.setattr(dcpscan, "CHILD_AS_BYTES", 4 << 30)  # held whole now: its items counted
    got = dcpscan.scan_byte_items(folder, lambda f, where: None)
    assert got is not None and "more than 10,000 byte items" in got.why, got


def test_the_childs_deadline_and_output_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _fake(tmp_path / "few", n=50, length=5)
    monkeypatch.setattr(dcpscan, "CHILD_TIMEOUT_S", 0.001)
    t0 = time.monotonic()
    got = dcpscan.scan_byte_items(folder, lambda f, where: None)
    assert got is not None and "did not finish within 0.001 s" in got.why and got.transient, got
    assert time.monotonic() - t0 < 30
    monkeypatch.setattr(dcpscan, "CHILD_TIMEOUT_S", 180.0)
    monkeypatch.setattr(dcpscan, "CHILD_OUTPUT_BYTES", 500)  # 50 items are about 2,400 bytes
    got = dcpscan.scan_byte_items(folder, lambda f, where: None)
    assert got is not None and "printed more than the 500 bytes" in got.why and not got.transient, got


def test_a_metadata_naming_anything_else_is_refused_by_the_child_too(tmp_path: Path) -> None:
    """The child's own allowlist, shown without the walk before it: a name outside DCP's classes."""
    folder = tmp_path / "other"
    folder.mkdir()
    (folder / ".metadata").write_bytes(b"\x80\x04\x8c\x02os\x8c\x06system\x93)R.")
    got = dcpscan.scan_byte_items(folder, lambda f, where: None)
    assert got is not None and "it names os.system" in got.why, got
    assert scan_refusal(folder) is not None  # and the walk refuses it first


def test_a_metadata_past_the_held_whole_bound_is_walked_from_the_file(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Past WHOLE_METADATA_BYTES the walk reads from the file (constant memory) and judges the same."""
    from supervisor.checkpoints import picklescan
    monkeypatch.setattr(picklescan, "WHOLE_METADATA_BYTES", 0)
    assert scan_refusal(_fake(tmp_path / "ok", n=3, length=5)) is None
    other = tmp_path / "other"
    other.mkdir()
    (other / ".metadata").write_bytes(b"\x80\x04\x8c\x02os\x8c\x06system\x93)R.")
    got = scan_refusal(other)
    assert got is not None and got.file == ".metadata" and "references os.system" in got.why, got
