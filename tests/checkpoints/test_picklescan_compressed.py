"""A compressed pickle is told by its bytes, not its name (issue 34, checkpoint safety): a job may
``pickle.load(gzip.open("extra.gz"))`` as well as ``extra.pkl.gz``, and a file named only ``.gz``,
``.bz2`` or ``.xz`` was never scanned (the sniff saw compression magic, no pickle). Now it is
decompressed into the scan within the byte budget (a bomb is not called checked, with the
reason), while compressed files that hold no pickle (a ``code.tar.gz`` snapshot, a ``.txt.gz``
log, a JSON) pass as every non-pickle file does. Real files made by gzip, bz2, lzma and tarfile;
each payload shown to run under the careless load a job would do."""
from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any, Callable

import pytest

from supervisor.checkpoints.picklescan import scan_refusal, sniffed
from supervisor.checkpoints.picklestream import MAX_PICKLE_BYTES

OPENERS: dict[str, Callable[..., Any]] = {"extra.gz": gzip.open, "state.bz2": bz2.open, "rng.xz": lzma.open}
CARELESS = "import bz2, gzip, lzma, pickle, sys; pickle.load({opener}.open(sys.argv[1]))"


def _payload(marker: Path) -> bytes:
    return f"cposix\nsystem\n(S'touch {marker}'\ntR.".encode()  # protocol 0: no PROTO marker either


def _folder(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"")  # never sniffed: what the job's weights would be
    return folder


@pytest.mark.parametrize("name", sorted(OPENERS))
def test_a_pickle_compressed_under_a_plain_compression_name_is_scanned(tmp_path: Path, name: str) -> None:
    marker = tmp_path / "RAN"
    folder = _folder(tmp_path, "checkpoint-10")
    with OPENERS[name](folder / name, "wb") as f:
        f.write(_payload(marker))
    opener = {"gz": "gzip", "bz2": "bz2", "xz": "lzma"}[name.rsplit(".", 1)[1]]
    subprocess.run([sys.executable, "-c", CARELESS.format(opener=opener), str(folder / name)], check=True, timeout=60)
    assert marker.exists(), "the careless load did not run the payload"
    marker.unlink()
    got = scan_refusal(folder)
    assert got is not None and got.file == name, got
    assert "posix.system" in got.why and "runs code" in got.why, got
    assert not marker.exists()


def test_compressed_files_that_hold_no_pickle_pass(tmp_path: Path) -> None:
    folder = _folder(tmp_path, "checkpoint-20")
    src = io.BytesIO(b"import torch\nprint('train')\n")
    with tarfile.open(folder / "code.tar.gz", "w:gz") as tar:
        info = tarfile.TarInfo("train.py")
        info.size = len(src.getvalue())
        tar.addfile(info, src)
    with tarfile.open(folder / "code.tar.xz", "w:xz") as tar:
        tar.add(folder / "model.safetensors", arcname="model.safetensors")
    with gzip.open(folder / "train.log.gz", "wt") as f:
        f.write("step 10 loss 2.5\n" * 1000)
    with bz2.open(folder / "config.json.bz2", "wt") as f:
        json.dump({"lr": 0.1, "layers": list(range(500))}, f)
    (folder / "broken.gz").write_bytes(b"\x1f\x8b\x08\x00" + b"garbage")  # no loader reads it either
    for name in ("code.tar.gz", "code.tar.xz", "train.log.gz", "config.json.bz2", "broken.gz"):
        assert not sniffed(str(folder / name)), name
    assert scan_refusal(folder) is None
    with gzip.open(folder / "plain.gz", "wb") as f:  # a pickle of plain data: read, and it passes
        f.write(b"\x80\x04]\x94(K\x01K\x02e.")
    assert sniffed(str(folder / "plain.gz")) and scan_refusal(folder) is None


def test_a_compression_bomb_of_any_name_is_refused_with_its_reason(tmp_path: Path) -> None:
    """80 MiB of pickle once decompressed (80 x 1 MiB byte strings), 80 KiB on disk, named only
    .gz: the byte budget counts decompressed bytes; past it, refused with the bound named."""
    folder = _folder(tmp_path, "checkpoint-30")
    with gzip.open(folder / "extra.gz", "wb") as f:
        f.write(b"\x80\x04")
        chunk = b"\x8e" + (1 << 20).to_bytes(8, "little") + bytes(1 << 20) + b"0"  # BINBYTES8, POP
        for _ in range((MAX_PICKLE_BYTES >> 20) + 16):
            f.write(chunk)
        f.write(b"N.")
    assert (folder / "extra.gz").stat().st_size < 1 << 20
    got = scan_refusal(folder)
    assert got is not None and got.file == "extra.gz", got
    assert "more than 64 MiB of pickle data to walk (the scan's bound)" in got.why and "not called checked" in got.why
