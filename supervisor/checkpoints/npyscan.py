"""The pickle scan's readers for numpy files and compressed pickles (issue 34 D6): what a job loads
with ``np.load(..., allow_pickle=True)`` or ``pickle.load(gzip.open(...))`` is checked as a pickle.

- ``.npy`` (``\\x93NUMPY``, version 1-3): a little-endian length, then a header that is a short
  Python literal dict (``{'descr': '<f4', 'fortran_order': False, 'shape': (3,)}``), read with
  :func:`ast.literal_eval` only when at most :data:`MAX_HEADER_BYTES` long. An array whose dtype
  holds no object field (``descr`` has no ``O`` type code, a structured dtype's fields walked) is raw
  data that ``np.load`` never unpickles: it passes unread. An object array (``dtype=object``, what
  ``np.save`` makes of ``np.random.get_state()`` or of a list of anything) is a pickle after the
  header: it is walked as any pickle, and may import only numpy's own reconstructors of plain arrays
  (``numpy._core.multiarray._reconstruct`` / ``scalar``, ``numpy.ndarray``, ``numpy.dtype``, the
  ``numpy.dtypes`` classes) beside the tensor-rebuild allowlist: an object array of plain values
  (numbers, strings, lists, dicts, nested numeric arrays) passes, one of arbitrary objects is refused.
- ``.npz``: a zip of ``.npy`` members, each read so (the zip reader in :mod:`.picklescan`).
- A pickle compressed with gzip, bz2 or xz, told by its magic bytes whatever its name (``optimizer.pt.gz``,
  ``state.pkl.xz``, ``extra.gz``), is decompressed through the scan's :class:`~.picklestream.BoundedReader`: the byte budget counts
  the decompressed bytes, so a bomb stops at 64 MiB and is not called checked. What is inside is read
  as pickles (a plain pickle, a legacy torch file); a torch zip or tar inside a compressed pickle is not
  read (it would need the whole of it decompressed) and is not called checked, nor is a ``.zst`` /
  ``.lz4`` pickle (no reader in the standard library). A compressed file of another name is sniffed
  by its first decompressed bytes as any file is (:func:`.picklescan.sniffed`): a tar inside (a
  ``code.tar.gz`` snapshot), text or JSON is no pickle and is not scanned.
"""
from __future__ import annotations

import ast
import bz2
import gzip
import lzma
import struct
from pathlib import Path
from typing import Any, Callable

from .picklestream import BoundedReader, Budget, Unreadable, read_stream

NPY_MAGIC = b"\x93NUMPY"
NUMPY_SUFFIXES = (".npy", ".npz")
MAX_HEADER_BYTES = 65_536  # numpy's own default is 10,000 (lifted by allow_pickle=True)
MAX_NPZ_MEMBERS = 1024
_OPENERS: dict[str, Callable[[Path], Any]] = {
    ".gz": lambda p: gzip.open(p, "rb"), ".bz2": lambda p: bz2.open(p, "rb"), ".xz": lambda p: lzma.open(p, "rb")}
# Told by content, not by name: ``extra.gz`` or ``state`` may be a gzip of a pickle all the same.
_MAGIC = ((b"\x1f\x8b", ".gz"), (b"BZh", ".bz2"), (b"\xfd7zXZ\x00", ".xz"))
COMPRESSION_ERRORS = (gzip.BadGzipFile, lzma.LZMAError)


def numpy_reconstruct(module: str, name: str) -> bool:
    """The names numpy's pickle of an array of plain values imports: data, no code."""
    if module in ("numpy.core.multiarray", "numpy._core.multiarray") and name in ("_reconstruct", "scalar"):
        return True
    return (module == "numpy" and name in ("ndarray", "dtype")) or (module == "numpy.dtypes" and name.endswith("DType"))


def _has_object(descr: Any, depth: int = 0) -> bool:
    """Whether a ``descr`` (a type string, or a structured dtype's ``[(name, descr[, shape]), ...]``)
    holds an object field; a shape no ``np.save`` writes is unreadable."""
    if depth > 32:
        raise Unreadable("a dtype nested too deep")
    if isinstance(descr, str):
        return "O" in descr.lstrip("<>|=")[:1]
    if isinstance(descr, list):
        for field in descr:
            if not (isinstance(field, tuple) and 2 <= len(field) <= 3):
                raise Unreadable(f"a dtype field that is not (name, type[, shape]): {field!r:.80}")
            if _has_object(field[1], depth + 1):
                return True
        return False
    raise Unreadable(f"a dtype description that is neither a type nor fields: {descr!r:.80}")


def npy_header(r: BoundedReader) -> dict[str, Any]:
    """The header dict of the ``.npy`` data ``r`` is at (its magic included)."""
    head = r.read(8)
    if len(head) != 8 or not head.startswith(NPY_MAGIC) or head[6] not in (1, 2, 3):
        raise Unreadable("not a .npy file of version 1, 2 or 3")
    raw = r.read(2 if head[6] == 1 else 4)
    (size,) = struct.unpack("<H" if head[6] == 1 else "<I", raw) if len(raw) in (2, 4) else (-1,)
    if not 0 <= size <= MAX_HEADER_BYTES:
        raise Unreadable(f"a .npy header of more than {MAX_HEADER_BYTES:,} bytes (the scan's bound)")
    text = r.read(size)
    if len(text) != size:
        raise Unreadable("it ends inside its .npy header")
    try:
        header = ast.literal_eval(text.decode("utf-8" if head[6] == 3 else "latin1"))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError, UnicodeDecodeError):
        raise Unreadable("a .npy header that is no Python literal") from None
    if not isinstance(header, dict) or "descr" not in header:
        raise Unreadable("a .npy header without a dtype (descr)")
    return header


def scan_npy(r: BoundedReader, check: Callable[[str | None], None]) -> None:
    """One ``.npy``: its header, then, for an object array, the pickle ``np.load`` would unpickle."""
    if _has_object(npy_header(r)["descr"]):
        if read_stream(r, check) is None:
            raise Unreadable("an object array whose pickle is missing")


def compression_of(head: bytes) -> str | None:
    """The compression a file's first bytes show (``.gz``, ``.bz2``, ``.xz``), or None."""
    return next((kind for magic, kind in _MAGIC if head.startswith(magic)), None)


def decompressed_head(path: Path, kind: str, n: int) -> bytes:
    """At most ``n`` bytes of what ``path`` decompresses to (what a sniff looks at: bounded)."""
    with _OPENERS[kind](path) as f:
        return bytes(f.read(n))


def scan_compressed(path: Path, kind: str, budget: Budget, scan_pickles: Callable[[BoundedReader], None]) -> None:
    """A compressed pickle (``kind`` told by its bytes), decompressed within the budget into ``scan_pickles``."""
    with _OPENERS[kind](path) as f:
        r = BoundedReader(f, budget)
        if r.at_end():
            raise Unreadable("an empty file once decompressed")
        head = r.read(4)
        if head.startswith(b"PK") or head.startswith(NPY_MAGIC[:4]):
            raise Unreadable("a zip or a .npy inside a compressed file (not read inside)")
        r.push_back(head)
        scan_pickles(r)
