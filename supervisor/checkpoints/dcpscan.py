"""A torch.distributed.checkpoint (DCP) save's byte items, found for the pickle scan.

DCP's FileSystemWriter writes each tensor as raw bytes into a ``*.distcp`` file and each other
item (a ``BytesIO``: optimizer param groups, rng and dataloader states, any Python object the job
saves) as ``torch.save``'s bytes at an offset of its own; the reader hands those bytes to
``torch.load(weights_only=False)``, so a byte item can run code when the job resumes. Where each
item lies is in ``.metadata`` (``storage_data``: a ``MetadataIndex`` -> ``_StorageInfo(relative_path,
offset, length)``; ``state_dict_metadata`` says which items are bytes).

Read here, in the daemon, not in the load test's child: the scan must judge the save before an
overlapped launch (``verify = "overlap"``), with no load test run and whatever ``load_test`` says,
and its judgement of a byte item must be the same allowlist walk as every other pickle
(:mod:`.picklescan`), which the standalone child cannot import. The daemon never imports torch,
so ``.metadata`` is unpickled with DCP's own classes stood in for by plain holders: only once
the pickle scan's opcode walk has passed it (only DCP's data classes, sizes and dtypes named,
within the scan's budget), and ``find_class`` gives nothing but those holders (any other name
is refused before anything is imported). Tensor items are raw bytes, never unpickled: skipped.

Bounds: ``.metadata`` at most ``MAX_METADATA_BYTES``; at most ``MAX_ITEMS`` storage entries and
``MAX_BYTE_ITEMS`` byte items of ``MAX_ITEM_BYTES`` in all (their pickles also spend the scan's
:class:`~.picklestream.Budget`); an item must lie inside its file, a regular file of the folder
(opened without blocking, a FIFO never read), stored plain (a transform such as compression is
not read). Past any of them, or anything that does not parse:
a :class:`~.pickledeny.Refusal` (not called checked), never a pass.
"""
from __future__ import annotations

import io
import os
import pickle
import stat
from pathlib import Path
from typing import IO, Any, Callable

from ..errors import SupervisorError
from .pickledeny import Refusal

DCP_METADATA = ".metadata"
MAX_METADATA_BYTES = 64 << 20
MAX_ITEMS = 1_000_000
MAX_BYTE_ITEMS = 10_000
MAX_ITEM_BYTES = 64 << 20  # all byte items together: real ones are a few KiB each
# .metadata's own walk (its opcodes are not the checkpoint's budget): about 108 opcodes and 250
# bytes a storage entry, and about 3.5 KiB of stand-ins an entry while it is read (measured on a
# real save of 40,000 tensors: 4.3 million opcodes, 10 MB, walked in 2.4 s and read into stand-ins
# in 0.8 s, 140 MiB at the peak, freed after). 6 million: a save of about 55,000 entries, 200 MiB
# at the peak. No set in it (DCP's classes hold none): a set is 200 bytes built from one byte,
# so a hostile one within the bound builds at most about 100 bytes an opcode (a dict).
METADATA_OPCODES = 6_000_000
SET_OPS = frozenset({"EMPTY_SET", "FROZENSET", "ADDITEMS"})

_META = "torch.distributed.checkpoint.metadata"
_DCP_DATA = frozenset({(_META, n) for n in (
    "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
    "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath")})


def dcp_data(module: str, name: str) -> bool:
    """DCP's own data classes, which a ``.metadata`` may name beyond the tensor-rebuild allowlist."""
    return (module, name) in _DCP_DATA


class _Holder:
    """A stand-in for any class ``.metadata`` names: keeps its arguments and state, runs nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, dict):
            self.__dict__.update(state)
        else:
            self.state = state


class _Unreadable(SupervisorError):
    """The .metadata cannot be read into stand-ins (the message says why): the save is refused."""


class _Holders(pickle.Unpickler):
    """Each allowed name becomes a holder class named after it; anything else is refused."""

    def __init__(self, f: IO[bytes]) -> None:
        super().__init__(f)
        self._kinds: dict[tuple[str, str], type] = {}

    def find_class(self, module: str, name: str) -> Any:
        if not (dcp_data(module, name) or module in ("torch", "torch.serialization", "collections")):
            raise _Unreadable(f"it names {module}.{name}")
        return self._kinds.setdefault((module, name), type(name, (_Holder,), {}))

    def persistent_load(self, pid: Any) -> Any:
        raise _Unreadable("it holds a persistent id")


def _open_regular(path: Path) -> IO[bytes]:
    """Opened without blocking (a FIFO in a file's place would hold the scan for good), read only
    when a regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _Unreadable(f"{path.name} is not a regular file")
    return os.fdopen(fd, "rb")


def _read_metadata(folder: Path) -> Any:
    with _open_regular(folder / DCP_METADATA) as f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_METADATA_BYTES:
            raise _Unreadable(f"{size:,} bytes, past the {MAX_METADATA_BYTES >> 20} MiB the scan reads")
        data = f.read(MAX_METADATA_BYTES + 1)
    try:
        return _Holders(io.BytesIO(data)).load()
    except _Unreadable:
        raise
    except Exception as exc:  # a garbled pickle: anything the unpickler raises
        raise _Unreadable(f"it does not unpickle ({type(exc).__name__}: {str(exc)[:200]})") from None


def _byte_items(md: Any) -> list[tuple[str, str, int, int]]:
    """(fqn, relative_path, offset, length) of every byte item, in the metadata's order."""
    sdm, storage = getattr(md, "state_dict_metadata", None), getattr(md, "storage_data", None)
    if type(md).__name__ != "Metadata" or not isinstance(sdm, dict) or not isinstance(storage, dict):
        raise _Unreadable("it is not DCP's Metadata with a state_dict_metadata and a storage_data")
    if len(storage) > MAX_ITEMS or len(sdm) > MAX_ITEMS:
        raise _Unreadable(f"more than {MAX_ITEMS:,} items, the most the scan reads")
    out: list[tuple[str, str, int, int]] = []
    for index, info in storage.items():
        fqn = getattr(index, "fqn", None)
        if not isinstance(fqn, str) or type(sdm.get(fqn)).__name__ != "BytesStorageMetadata":
            continue  # a tensor's raw bytes (or an entry no load reads): never unpickled
        rel, offset, length = (getattr(info, k, None) for k in ("relative_path", "offset", "length"))
        if not (isinstance(rel, str) and type(offset) is int and type(length) is int and offset >= 0 and length >= 0):
            raise _Unreadable(f"the place of {fqn!r} is not a file, an offset and a length")
        if getattr(info, "transform_descriptors", None):
            raise _Unreadable(f"{fqn!r} is stored through a transform ({info.transform_descriptors!r}) "
                              "the scan does not read")
        out.append((fqn, rel, offset, length))
        if len(out) > MAX_BYTE_ITEMS:
            raise _Unreadable(f"more than {MAX_BYTE_ITEMS:,} byte items, the most the scan reads")
    return out


def scan_byte_items(folder: Path, scan_item: Callable[[IO[bytes], str], str | None]) -> Refusal | None:
    """Each byte item of the DCP save in ``folder`` through ``scan_item`` (the pickle scan of one
    stream: the refusal's words, or None); the first refusal, or one for what cannot be read.
    ``scan_item`` spends the checkpoint's :class:`~.picklestream.Budget` as any pickle does."""
    try:
        items = _byte_items(_read_metadata(folder))
    except _Unreadable as exc:
        return Refusal(DCP_METADATA, f"{DCP_METADATA}: {exc}, so its byte items are not called checked")
    except OSError as exc:
        return Refusal(DCP_METADATA, f"{DCP_METADATA}: cannot be read now ({exc.strerror or exc})")
    files: dict[str, IO[bytes]] = {}
    total = 0
    try:
        for fqn, rel, offset, length in items:
            where = f"{rel}[{fqn}]"
            if os.path.basename(rel) != rel or rel in ("", ".", ".."):
                return Refusal(rel, f"{where}: .metadata places a byte item outside the folder, so it is not called checked")
            total += length
            if total > MAX_ITEM_BYTES:
                return Refusal(rel, f"{where}: byte items of more than {MAX_ITEM_BYTES >> 20} MiB in all, "
                                    "past what the scan reads, so they are not called checked")
            f = files.get(rel)
            if f is None:
                f = files[rel] = _open_regular(folder / rel)
            size = os.fstat(f.fileno()).st_size
            if offset + length > size:
                return Refusal(rel, f"{where}: .metadata places a byte item at {offset:,}+{length:,}, past the "
                                    f"file's end ({size:,} bytes), so it is not called checked")
            f.seek(offset)
            why = scan_item(io.BytesIO(f.read(length)), where)
            if why:
                return Refusal(rel, why)
    except (OSError, _Unreadable) as exc:
        return Refusal(DCP_METADATA, f"{DCP_METADATA}: a file it names cannot be read now "
                                     f"({getattr(exc, 'strerror', None) or exc}), so it is not called checked")
    finally:
        for f in files.values():
            f.close()
    return None


__all__ = ["DCP_METADATA", "MAX_BYTE_ITEMS", "MAX_ITEMS", "MAX_ITEM_BYTES", "MAX_METADATA_BYTES", "METADATA_OPCODES",
           "SET_OPS", "dcp_data",
           "scan_byte_items"]
