"""Where a DCP save's byte items lie, read from its ``.metadata`` in a child of its own.

Run by :mod:`.dcpscan` as ``python -I -S _dcpitems_script.py METADATA MAX_ITEMS MAX_BYTE_ITEMS
AS_BYTES`` with the daemon's own interpreter, and imported by nothing but it: stdlib only (``-S``:
no site, no package of ours), so it runs the same from a source tree or an install.

Why a child: unpickling a ``.metadata`` into stand-ins costs about 2.4-3.5 KiB an entry (every
object the pickle memoizes is held until the load ends: the C unpickler's memo), 350 MiB for a
150,000-entry FSDP save and past 1 GiB at the opcode bound; in the daemon that was a budget of
55,000 entries, and a larger healthy save was not ready. Here it costs the daemon nothing: the
child runs under an address-space limit (``RLIMIT_AS``) and prints only the byte items, at most
``MAX_BYTE_ITEMS`` lines, which the daemon reads to a bounded head and scans itself. Why
unpickle at all instead of reading the opcodes: the real unpickler's own semantics (a key set
twice, a memo fetched, a BUILD) decide where DCP's reader finds an item, and a second reading of
them is a second chance to differ from it; the load here runs nothing (below).

Only after the daemon's opcode walk passed the file (DCP's data classes, sizes and dtypes named,
no set, within its budget); here too ``find_class`` gives nothing but plain holders for those names
(any other name is refused before anything is imported). Output, one JSON object a line:
``{"item": [fqn, relative_path, offset, length]}`` for each byte item in the metadata's order, then
``{"done": N, "identity": [ino, size, mtime_ns]}``; or ``{"refused": why}`` and exit status 3.
"""
from __future__ import annotations

import io
import json
import os
import pickle
import resource
import stat
import sys
from typing import IO, Any

_META = "torch.distributed.checkpoint.metadata"
_DCP_DATA = frozenset({(_META, n) for n in (
    "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
    "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath")})
REFUSED_EXIT = 3


def dcp_data(module: str, name: str) -> bool:
    """DCP's own data classes, which a ``.metadata`` may name beyond the tensor-rebuild allowlist."""
    return (module, name) in _DCP_DATA


class Unreadable(Exception):
    """The .metadata cannot be read into stand-ins (the message says why)."""


class _Holder:
    """A stand-in for any class ``.metadata`` names: keeps its arguments and state, runs nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, dict):
            self.__dict__.update(state)
        else:
            self.state = state


class _Holders(pickle.Unpickler):
    """Each allowed name becomes a holder class named after it; anything else is refused."""

    def __init__(self, f: IO[bytes]) -> None:
        super().__init__(f)
        self._kinds: dict[tuple[str, str], type] = {}

    def find_class(self, module: str, name: str) -> Any:
        if not (dcp_data(module, name) or module in ("torch", "torch.serialization", "collections")):
            raise Unreadable(f"it names {module}.{name}")
        return self._kinds.setdefault((module, name), type(name, (_Holder,), {}))

    def persistent_load(self, pid: Any) -> Any:
        raise Unreadable("it holds a persistent id")


def read_metadata(path: str) -> tuple[Any, list[int]]:
    """The stand-ins of ``path`` and the identity of the file read (ino, size, mtime_ns)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO in its place would hold us for good
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Unreadable(f"{os.path.basename(path)} is not a regular file")
        data = f.read()
    try:
        return _Holders(io.BytesIO(data)).load(), [st.st_ino, st.st_size, st.st_mtime_ns]
    except (Unreadable, MemoryError):
        raise
    except Exception as exc:  # a garbled pickle: anything the unpickler raises
        raise Unreadable(f"it does not unpickle ({type(exc).__name__}: {str(exc)[:200]})") from None


def byte_items(md: Any, max_items: int, max_byte_items: int) -> list[tuple[str, str, int, int]]:
    """(fqn, relative_path, offset, length) of every byte item, in the metadata's order."""
    sdm, storage = getattr(md, "state_dict_metadata", None), getattr(md, "storage_data", None)
    if type(md).__name__ != "Metadata" or not isinstance(sdm, dict) or not isinstance(storage, dict):
        raise Unreadable("it is not DCP's Metadata with a state_dict_metadata and a storage_data")
    if len(storage) > max_items or len(sdm) > max_items:
        raise Unreadable(f"more than {max_items:,} items, the most the scan reads")
    out: list[tuple[str, str, int, int]] = []
    for index, info in storage.items():
        fqn = getattr(index, "fqn", None)
        if not isinstance(fqn, str) or type(sdm.get(fqn)).__name__ != "BytesStorageMetadata":
            continue  # a tensor's raw bytes (or an entry no load reads): never unpickled
        rel, offset, length = (getattr(info, k, None) for k in ("relative_path", "offset", "length"))
        if not (isinstance(rel, str) and type(offset) is int and type(length) is int and offset >= 0 and length >= 0):
            raise Unreadable(f"the place of {fqn!r} is not a file, an offset and a length")
        if getattr(info, "transform_descriptors", None):
            raise Unreadable(f"{fqn!r} is stored through a transform ({str(info.transform_descriptors)[:200]}) "
                             "the scan does not read")
        out.append((fqn, rel, offset, length))
        if len(out) > max_byte_items:
            raise Unreadable(f"more than {max_byte_items:,} byte items, the most the scan reads")
    return out


def main(argv: list[str]) -> int:
    path, max_items, max_byte_items, as_bytes = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    resource.setrlimit(resource.RLIMIT_AS, (as_bytes, as_bytes))
    try:
        md, identity = read_metadata(path)
        items = byte_items(md, max_items, max_byte_items)
    except Unreadable as exc:
        print(json.dumps({"refused": str(exc)}), flush=True)
        return REFUSED_EXIT
    except MemoryError:
        md = None  # what little is left goes to the message
        print(json.dumps({"refused": f"reading it took more than the {as_bytes >> 20} MiB its reader may use"}),
              flush=True)
        return REFUSED_EXIT
    except OSError as exc:
        print(json.dumps({"refused": f"it cannot be read now ({exc.strerror or exc})"}), flush=True)
        return REFUSED_EXIT
    out = sys.stdout
    for item in items:
        out.write(json.dumps({"item": item}) + "\n")
    out.write(json.dumps({"done": len(items), "identity": identity}) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
