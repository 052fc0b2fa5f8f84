"""Issue 34 part 5, only checked bytes are handed over: the pickle scan reads every pickle protocol
(0-5) and every torch format (zip, legacy raw, legacy tar), each with a payload that is proven
to run when loaded carelessly, and refuses what it cannot read; its memory and CPU are bounded."""
from __future__ import annotations

import gzip
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from supervisor.checkpoints import picklescan
from supervisor.checkpoints.picklescan import unsafe_pickle
from supervisor.checkpoints.picklestream import MAX_PICKLE_BYTES, Budget

HELPER = Path(__file__).resolve().parent.parent / "helpers" / "hostile_pickles.py"


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The files, written by real torch.save / pickle in a subprocess of the venv's Python."""
    out = tmp_path_factory.mktemp("hostile")
    subprocess.run([sys.executable, str(HELPER), str(out)], check=True, timeout=300)
    return out, json.loads((out / "index.json").read_text())


def test_every_protocol_and_format_with_a_payload_is_refused_without_running_it(made: tuple[Path, dict[str, Any]]) -> None:
    out, index = made
    assert len(index) == 23, sorted(index)
    assert all(v["ran"] for v in index.values()), "each fixture runs its payload under a careless load: " + str(
        [k for k, v in index.items() if not v["ran"]])
    for name in sorted(index):
        why = unsafe_pickle(out / name)
        assert why is not None and "posix.system" in why and "allowlist" in why, (name, why)
    for p in ("torch_zip_p1.pt", "torch_legacy_p1.pt", "torch_legacy_p0.pt", "torch_tar.tar", "plain_p0.pkl",
              "dcp_metadata"):
        assert p in index  # the cases the issue names, by name
    assert not [v["marker"] for v in index.values() if Path(v["marker"]).exists()], "the scan never executes"


def test_the_same_formats_without_a_payload_pass(made: tuple[Path, dict[str, Any]]) -> None:
    out, _ = made
    good = sorted(out.glob("good_*"))
    assert len(good) == 19, [p.name for p in good]  # good_dcp: a folder, its .metadata scanned
    assert {p.name: unsafe_pickle(p) for p in good} == {p.name: None for p in good}


def test_what_cannot_be_read_is_not_called_checked(made: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    out, _ = made
    legacy = (out / "good_torch_legacy_p1.pt").read_bytes()
    cases = {
        "cut.pt": legacy[:60],  # inside the data pickle: torch.load would run what came before
        "empty.pt": b"",
        "text.pt": b"hello, not a checkpoint\n",
        "zeros.pt": bytes(4096),
        "zip_without_pickle.pt": _zip_without_pickle(tmp_path),
        "trailing.pkl": (out / "good_plain_p1.pkl").read_bytes() + b"\xff garbage",
        "bad_crc.pt": _flip_in_member((out / "good_torch_zip_p2.pt").read_bytes(), b"bias"),
    }
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        why = unsafe_pickle(tmp_path / name)
        assert why is not None and why.startswith(name) and "not called checked" in why, (name, why)
    # A whole safetensors file is no pickle and holds no code: it passes.
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    (tmp_path / "m.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(8))
    assert unsafe_pickle(tmp_path / "m.safetensors") is None


def _flip_in_member(data: bytes, word: bytes) -> bytes:
    """A torch zip whose data.pkl (stored, not deflated) has one name changed: still a whole
    pickle, but not the bytes its CRC was computed over."""
    at = data.index(word)
    return data[:at] + word.upper() + data[at + len(word):]


def _zip_without_pickle(tmp_path: Path) -> bytes:
    import zipfile

    p = tmp_path / "z.zip"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("archive/data/0", bytes(8))
    return p.read_bytes()


def test_a_folder_holding_one_hostile_file_is_refused(made: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    out, _ = made
    folder = tmp_path / "checkpoint-10"
    (folder / "sub").mkdir(parents=True)
    (folder / "optimizer.pt").write_bytes((out / "good_torch_zip_p2.pt").read_bytes())
    assert unsafe_pickle(folder) is None
    (folder / "sub" / "scheduler.pt").write_bytes((out / "torch_legacy_p1.pt").read_bytes())
    why = unsafe_pickle(folder)
    assert why is not None and why.startswith("sub/scheduler.pt") and "posix.system" in why, why


def test_a_payload_three_levels_deep_is_refused(made: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    """The whole folder is scanned, not its top levels: a job may load any file under it."""
    out, index = made
    folder = tmp_path / "checkpoint-20"
    deep = folder / "a" / "b" / "c"
    deep.mkdir(parents=True)
    for d in (folder, folder / "a", folder / "a" / "b", deep):
        (d / "optimizer.pt").write_bytes((out / "good_torch_zip_p2.pt").read_bytes())
    (deep / "model.pkl").write_bytes((out / "good_plain_p4.pkl").read_bytes())
    assert unsafe_pickle(folder) is None  # whole and harmless at every depth
    for name in ("torch_legacy_p1.pt", "plain_p0.pkl", "torch_zip_p5.pt"):
        (deep / "model.pkl").write_bytes((out / name).read_bytes())
        why = unsafe_pickle(folder)
        assert why is not None and why.startswith("a/b/c/model.pkl") and "posix.system" in why, (name, why)
    (deep / "model.pkl").write_bytes((out / "good_plain_p4.pkl").read_bytes())
    # A DCP checkpoint kept three levels down: its .metadata is loaded with a plain pickle.load.
    (deep / "dcp").mkdir()
    (deep / "dcp" / ".metadata").write_bytes((out / "dcp_metadata" / ".metadata").read_bytes())
    why = unsafe_pickle(folder)
    assert why is not None and why.startswith("a/b/c/dcp/.metadata") and "posix.system" in why, why
    assert not [v["marker"] for v in index.values() if Path(v["marker"]).exists()], "the scan never executes"


def test_a_folder_walk_past_its_bounds_is_not_called_checked(made: tuple[Path, dict[str, Any]], tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Deeper is not unbounded: past the entries or the pickle files the walk looks at, the
    checkpoint is not called checked (load-tested before the launch). The bounds are lowered
    here; the same code holds them at their defaults (100,000 entries, 10,000 pickle files)."""
    out, _ = made
    folder = tmp_path / "checkpoint-30"
    deep = folder / "x" / "y"
    deep.mkdir(parents=True)
    for i in range(40):
        (deep / f"shard-{i}.pt").write_bytes((out / "good_plain_p2.pkl").read_bytes())
    assert unsafe_pickle(folder) is None
    monkeypatch.setattr(picklescan, "MAX_FILES", 30)
    why = unsafe_pickle(folder)
    assert why == "checkpoint-30: more than 30 pickle files, the most the scan reads, so it is not called checked"
    monkeypatch.setattr(picklescan, "MAX_FILES", 10_000)
    for i in range(400):
        (deep / f"log-{i}.txt").write_bytes(b"")  # not pickles, but entries the walk looks at
    monkeypatch.setattr(picklescan, "MAX_ENTRIES", 200)
    t0 = time.monotonic()
    why = unsafe_pickle(folder)
    assert why == "checkpoint-30: more than 200 entries in its folders, so it is not called checked", why
    assert time.monotonic() - t0 < 5.0
    # A link to a folder is not followed (a loop, or a way out of the checkpoint).
    monkeypatch.setattr(picklescan, "MAX_ENTRIES", 100_000)
    (deep / "loop").symlink_to(folder)
    assert unsafe_pickle(folder) is None


def test_a_huge_pickle_is_refused_within_the_bound(tmp_path: Path) -> None:
    """A BINBYTES8 claiming 100x the byte bound (a sparse file, as large as it claims) is refused
    before any memory is taken for it; a stream of opcodes 100x past an op bound stops at it."""
    huge = tmp_path / "huge.pkl"
    n = 100 * MAX_PICKLE_BYTES
    with open(huge, "wb") as f:
        f.write(b"\x80\x04\x8e" + n.to_bytes(8, "little"))
        f.truncate(11 + n + 1)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.monotonic()
    why = unsafe_pickle(huge)
    assert why is not None and "MiB of pickle data" in why and "not called checked" in why, why
    assert time.monotonic() - t0 < 5.0
    grown_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kb < 64 * 1024, f"peak RSS grew by {grown_kb} kB for a {n >> 30} GiB claim"

    ops = tmp_path / "ops.pkl"
    ops.write_bytes(b"\x80\x02" + b"N" * 5_000_000 + b".")
    t0 = time.monotonic()
    why = unsafe_pickle(ops, Budget(max_ops=50_000))
    assert why is not None and "more than 50,000 pickle opcodes" in why, why
    assert time.monotonic() - t0 < 5.0
    ops.write_bytes(b"\x80\x02" + b"N" * 49_000 + b".")
    assert unsafe_pickle(ops, Budget(max_ops=50_000)) is None, "within the bound the same kind of stream passes"


def test_a_file_that_changes_while_it_is_checked_is_refused(made: tuple[Path, dict[str, Any]], tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    out, _ = made
    p = tmp_path / "state.pkl"
    p.write_bytes((out / "good_plain_p2.pkl").read_bytes())
    real = picklescan._scan_pickles

    def scan_then_rewrite(*args: Any) -> None:
        real(*args)
        with open(p, "ab") as f:  # the writer appends while the scan is on the file
            f.write(b"more")

    monkeypatch.setattr(picklescan, "_scan_pickles", scan_then_rewrite)
    why = unsafe_pickle(p)
    assert why is not None and "changed while it was checked" in why, why


def test_a_folder_s_pickles_are_found_by_their_bytes_not_only_their_names(made: tuple[Path, dict[str, Any]],
                                                                          tmp_path: Path) -> None:
    """A job loads ``model.pth.tar``, ``state.pickle`` or ``weights`` by its content: each file of
    the folder whose first bytes may start a pickle, a torch zip or a torch tar is scanned, and
    what an ordinary checkpoint folder holds beside its pickles (text, JSON, safetensors, DeepSpeed's
    ``latest``) is not taken for one."""
    out, index = made
    folder = tmp_path / "checkpoint-40"
    folder.mkdir()
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    benign = {"latest": b"global_step100", "README.md": b"This checkpoint was trained on 8 GPUs.\n" * 100,
              "config.json": b'{"hidden": 64}', "version": b"1.0\n", "iteration.txt": b"1000\n",
              "merges.txt": b"#version: 0.2\n", "hparams.yaml": b"seed: 1\nlr: 0.1\n",
              "model.safetensors": len(header).to_bytes(8, "little") + header + bytes(8),
              "weights": (out / "good_torch_zip_p2.pt").read_bytes(),
              "model.pth.tar": (out / "good_torch_tar.tar").read_bytes(),
              "state.pickle": (out / "good_plain_p4.pkl").read_bytes(),
              "rng": (out / "good_plain_p0.pkl").read_bytes(), "old": (out / "good_torch_legacy_p1.pt").read_bytes()}
    for name, data in benign.items():
        (folder / name).write_bytes(data)
    assert unsafe_pickle(folder) is None
    assert {p.name for p in picklescan._pickle_files(folder)} == {"weights", "model.pth.tar", "state.pickle", "old"}
    for name, hostile in (("model.pth.tar", "torch_tar.tar"), ("state.pickle", "plain_p0.pkl"),
                          ("weights", "torch_zip_p2.pt"), ("rng", "plain_p1.pkl"), ("old", "torch_legacy_p0.pt"),
                          ("extra", "second_stream.pkl"), ("deep", "nested5000_p0.pkl"), ("x.bin.1", "plain_p0.pkl")):
        target = folder / name
        kept = target.read_bytes() if target.exists() else None
        target.write_bytes((out / hostile).read_bytes())
        why = unsafe_pickle(folder)
        assert why is not None and why.startswith(name + ":") and "posix.system" in why, (name, why)
        if kept is None:
            target.unlink()
        else:
            target.write_bytes(kept)
    assert unsafe_pickle(folder) is None
    # A compressed pickle is read through its decompressor (issue 34 D6): plain data passes, a payload
    # is refused; one compressed with no reader in the standard library is never called checked.
    (folder / "opt.pkl.gz").write_bytes(gzip.compress((out / "good_plain_p4.pkl").read_bytes()))
    assert unsafe_pickle(folder) is None
    (folder / "opt.pkl.gz").write_bytes(gzip.compress((out / "plain_p4.pkl").read_bytes()))
    why = unsafe_pickle(folder)
    assert why is not None and why.startswith("opt.pkl.gz:") and "posix.system" in why, why
    (folder / "opt.pkl.gz").unlink()
    (folder / "opt.pkl.zst").write_bytes(b"\x28\xb5\x2f\xfd" + bytes(16))
    why = unsafe_pickle(folder)
    assert why is not None and why.startswith("opt.pkl.zst:") and "not called checked" in why, why
    assert not [v["marker"] for v in index.values() if Path(v["marker"]).exists()], "the scan never executes"


def test_the_sniff_is_bounded(made: tuple[Path, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out, _ = made
    folder = tmp_path / "checkpoint-50"
    folder.mkdir()
    for i in range(40):
        (folder / f"notes-{i}.txt").write_bytes(b"global_step100\n")
    assert unsafe_pickle(folder) is None
    monkeypatch.setattr(picklescan, "MAX_SNIFFED", 30)
    assert unsafe_pickle(folder) == ("checkpoint-50: more than 30 files of other names to look into, so it is "
                                     "not called checked")
    # What the sniff reads is its window: a payload past a long plain string is still found.
    monkeypatch.setattr(picklescan, "MAX_SNIFFED", 2_000)
    payload = (out / "plain_p0.pkl").read_bytes()
    (folder / "long").write_bytes(b"T" + (5000).to_bytes(4, "little") + b"x" * 5000 + payload)
    why = unsafe_pickle(folder)
    assert why is not None and why.startswith("long:") and "posix.system" in why, why
