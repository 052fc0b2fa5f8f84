"""Cheap structural checks of one checkpoint file: its container is whole, without reading the
tensors (milliseconds for any size: only the file's end and its directory are read).

A ``torch.save`` file (zip format, the default since torch 1.6) ends with a central directory
that lists every member with its offset and size; a save cut short has none, or names bytes past
the end of the file. A safetensors file starts with the length of its JSON header, and the header
names each tensor's byte range: both must lie inside the file (a length or a range past its end
is refused, the reason naming the file and the offsets), alone or inside a folder (an HF
``checkpoint-N/``'s ``model.safetensors``: ``verify = "overlap"`` hands a folder over on these
checks alone). Whatever passes here may still fail to load (a wrong key, a pickled class); the
load test decides that. Legacy (non-zip) torch files pass, and folders without safetensors files.
Bounds: a header up to ``MAX_SAFETENSORS_HEADER`` bytes read; in a folder, ``MAX_FOLDER_ENTRIES``
entries walked (links not followed) and ``MAX_FOLDER_SAFETENSORS`` files' headers read; past
those the rest is left to the load test.
"""
from __future__ import annotations

import json
import os
import struct
import zipfile
from pathlib import Path
from typing import Any

ZIP_MAGIC = b"PK\x03\x04"
#: The safetensors library refuses a header over 100 MB (its MAX_HEADER_SIZE); so do we, before reading it.
MAX_SAFETENSORS_HEADER = 100_000_000
#: In a folder: the entries walked and the safetensors headers read, at most (a DCP save of
#: 150,000 files costs a walk of this many entries; the load test reads everything anyway).
MAX_FOLDER_ENTRIES = 20_000
MAX_FOLDER_SAFETENSORS = 256
#: Bits per element of each dtype the safetensors format names (its Rust ``Dtype``, 0.6).
#: A dtype not listed here (a newer format's) is not judged by size: the job's own safetensors may
#: know it, and quarantining a good checkpoint costs a rollback; the load test (the job's library)
#: judges it. Its range, overlap and gaps are still checked.
DTYPE_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16,
              "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "F64": 64, "I64": 64, "U64": 64,
              "C64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}


def structure_problem(path: Path) -> str | None:
    """Why ``path`` is not a whole checkpoint container, or None (also for what is not checked)."""
    if path.is_dir():
        return _folder_problem(path)
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


def _folder_problem(root: Path) -> str | None:
    """The first safetensors file in ``root`` (any depth, by name) that is not whole, or None."""
    seen = read = 0
    todo = [root]
    try:
        while todo:
            folder = todo.pop()
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
            for e in entries:
                seen += 1
                if seen > MAX_FOLDER_ENTRIES:
                    return None
                if e.is_dir(follow_symlinks=False):
                    todo.append(Path(e.path))
                elif e.name.endswith(".safetensors") and e.is_file(follow_symlinks=False):
                    read += 1
                    if read > MAX_FOLDER_SAFETENSORS:
                        return None
                    p = Path(e.path)
                    with open(p, "rb") as f:
                        head = f.read(8)
                    why = _safetensors_problem(p, head, p.relative_to(root).as_posix())
                    if why:
                        return why
    except OSError as exc:
        return f"cannot read the checkpoint: {exc.strerror or exc}"
    return None


def _safetensors_problem(path: Path, head: bytes, name: str | None = None) -> str | None:
    """``name``: how the reason names the file (its place in a folder); its own name by default."""
    name = name or path.name
    size = path.stat().st_size
    if len(head) < 8:
        return f"truncated: {name}: a safetensors file of {size} bytes has no header"
    (n,) = struct.unpack("<Q", head)
    if n > MAX_SAFETENSORS_HEADER:  # the format's own limit: a bigger one is never read into memory
        return (f"{name}: the safetensors header claims {n} bytes, more than the format allows "
                f"({MAX_SAFETENSORS_HEADER}): corrupt or not safetensors")
    if 8 + n > size:
        return (f"truncated: {name}: its safetensors header length ({n} bytes, bytes 8-{8 + n}) runs past the end "
                f"of the file ({size} bytes)")
    with open(path, "rb") as f:
        f.seek(8)
        try:
            header = json.loads(f.read(n))
        except ValueError as exc:
            return f"{name}: the safetensors header is not valid JSON: {exc}"
    if not isinstance(header, dict):
        return f"{name}: the safetensors header is not an object"
    return _tensors_problem(name, header, size, n)


def _tensors_problem(name: str, header: dict[str, Any], size: int, n: int) -> str | None:
    """The rules the safetensors library itself applies before it hands over a tensor: every
    range inside the data section, each one exactly its shape times its dtype's size, and the
    ranges, in order, tiling the data section: no overlap, no gap, no byte after the last one.
    One sort of the ranges, then one pass (a header of 1,000,000 tensors: about a second)."""
    data = size - 8 - n  # the data section: offsets count from its start
    ranges: list[tuple[int, int, str]] = []
    for key, v in header.items():
        if key == "__metadata__":
            continue
        offs = v.get("data_offsets") if isinstance(v, dict) else None
        if not (isinstance(offs, list) and len(offs) == 2 and all(type(o) is int for o in offs)):
            return (f"{name}: tensor {key[:80]!r} has malformed data_offsets ({str(offs)[:80]}): "
                    "corrupt or not safetensors")
        lo, hi = offs
        if hi > data or lo > data:
            return (f"truncated: {name}: tensor {key[:80]!r} at bytes {lo}-{hi} of the data section runs past the end "
                    f"of the file (the data section is {data} bytes from byte {8 + n}; the file is {size} bytes)")
        if not 0 <= lo <= hi:
            return f"{name}: tensor {key[:80]!r} has data_offsets {lo}-{hi}, not a byte range: corrupt"
        why = _size_problem(key, v, hi - lo)
        if why:
            return f"{name}: {why}: corrupt (the safetensors library refuses it)"
        ranges.append((lo, hi, key))
    ranges.sort()
    end = 0
    for lo, hi, key in ranges:
        if lo != end:
            what = (f"overlaps the tensor before it (which ends at byte {end})" if lo < end
                    else f"leaves bytes {end}-{lo} unused before it")
            return (f"{name}: tensor {key[:80]!r} at bytes {lo}-{hi} of the data section {what}: corrupt "
                    "(the safetensors library refuses overlapping or gapped tensors)")
        end = hi
    if end != data:
        return (f"{name}: the tensors end at byte {end} of the data section but it is {data} bytes "
                f"(the file is {size} bytes): corrupt or appended to (the safetensors library refuses it)")
    return None


def _size_problem(key: str, v: dict[str, Any], nbytes: int) -> str | None:
    """Why tensor ``key``'s shape and dtype do not make ``nbytes`` bytes, or None."""
    shape, dtype = v.get("shape"), v.get("dtype")
    if not (isinstance(shape, list) and all(type(d) is int and 0 <= d < 2**64 for d in shape)):
        return f"tensor {key[:80]!r} has a malformed shape ({str(shape)[:80]})"
    if not isinstance(dtype, str):
        return f"tensor {key[:80]!r} has a malformed dtype ({str(dtype)[:40]})"
    bits = DTYPE_BITS.get(dtype)
    if bits is None:
        return None
    count = 0 if 0 in shape else 1
    for d in shape if count else ():
        count *= d
        if count * bits > 8 * nbytes:  # stop early: a shape of many huge dims never builds a huge int
            return (f"tensor {key[:80]!r} is {dtype} of shape {str(shape)[:80]} (more than {nbytes} bytes) "
                    f"but its data_offsets give it {nbytes} bytes")
    if count * bits != 8 * nbytes:
        need = f"{count * bits // 8} bytes" if count * bits % 8 == 0 else f"{count * bits} bits"
        return (f"tensor {key[:80]!r} is {dtype} of shape {str(shape)[:80]} ({need}) "
                f"but its data_offsets give it {nbytes} bytes")
    return None
