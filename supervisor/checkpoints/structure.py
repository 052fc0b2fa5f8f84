"""Cheap structural checks of one checkpoint file: its container is whole, without reading the
tensors (milliseconds for any size: only the file's end and its directory are read).

A ``torch.save`` file (zip format, the default since torch 1.6) ends with a central directory
that lists every member with its offset and size; a save cut short has none, or names bytes past
the end of the file. A safetensors file starts with the length of its JSON header, and the header
names each tensor's byte range. Whatever passes here may still fail to load (a wrong key, a
pickled class); the load test decides that. Legacy (non-zip) torch files and folders pass.
"""
from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

ZIP_MAGIC = b"PK\x03\x04"
#: The safetensors library refuses a header over 100 MB (its MAX_HEADER_SIZE); so do we, before reading it.
MAX_SAFETENSORS_HEADER = 100_000_000


def structure_problem(path: Path) -> str | None:
    """Why ``path`` is not a whole checkpoint container, or None (also for what is not checked)."""
    if not path.is_file():
        return None
    try:
        with open(path, "rb") as f:
            head = f.read(8)
        if head.startswith(ZIP_MAGIC):
            return _zip_problem(path)
        if path.suffix == ".safetensors":
            return _safetensors_problem(path, head)
    except OSError as exc:
        return f"cannot read the checkpoint: {exc.strerror or exc}"
    return None


def _zip_problem(path: Path) -> str | None:
    size = path.stat().st_size
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
    except (zipfile.BadZipFile, ValueError, EOFError) as exc:
        return f"truncated or corrupt: the torch zip archive is not whole (a save cut short?): {exc}"
    if not infos:
        return "the torch zip archive has no members"
    for i in infos:
        # The local header (30 bytes + name + extra) precedes the data; the data must fit.
        if i.header_offset + 30 + len(i.filename) + i.compress_size > size:
            return f"truncated: the torch zip archive names {i.filename} past the end of the file ({size} bytes)"
    return None


def _safetensors_problem(path: Path, head: bytes) -> str | None:
    size = path.stat().st_size
    if len(head) < 8:
        return f"truncated: a safetensors file of {size} bytes has no header"
    (n,) = struct.unpack("<Q", head)
    if n > MAX_SAFETENSORS_HEADER:  # the format's own limit: a bigger one is never read into memory
        return f"the safetensors header claims {n} bytes, more than the format allows ({MAX_SAFETENSORS_HEADER})"
    if 8 + n > size:
        return f"truncated: the safetensors header ({n} bytes) runs past the end of the file ({size} bytes)"
    with open(path, "rb") as f:
        f.seek(8)
        try:
            header = json.loads(f.read(n))
        except ValueError as exc:
            return f"the safetensors header is not valid JSON: {exc}"
    if not isinstance(header, dict):
        return "the safetensors header is not an object"
    try:
        end = max((int(v["data_offsets"][1]) for k, v in header.items()
                   if k != "__metadata__" and isinstance(v, dict) and "data_offsets" in v), default=0)
    except (TypeError, ValueError, IndexError, KeyError):
        return "the safetensors header has malformed data_offsets"
    if 8 + n + end > size:
        return f"truncated: the safetensors tensors end at byte {8 + n + end}, past the end of the file ({size} bytes)"
    return None
