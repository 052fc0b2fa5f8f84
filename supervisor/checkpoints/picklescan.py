"""A static check of a checkpoint's pickle streams: which callables would unpickling them import?

Run before ``checkpoints.verify = "overlap"`` hands the newest checkpoint to the job, whose load
test has not finished yet: only what this scan read whole and found inside the tensor-rebuild
allowlist (the globals ``torch.load(weights_only=True)`` accepts) is handed over. The streams are
walked with :func:`pickletools.genops` (:mod:`.picklestream`: opcodes only, nothing imported or
executed, within a bound), so the daemon still never imports torch. Formats are told apart as
``torch.load`` tells them: a zip (every ``*.pkl`` member), else a tar (torch < 0.4: every pickle of
its ``storages``, ``tensors`` and ``pickle`` members), else pickles of any protocol (a legacy torch
file: its five pickles, the magic number first, then raw storage bytes; any other file: every
stream to the end). What none of these reads whole (a file cut short, an unknown format, a file
past the bound or changed while read) is not called checked, so not handed over either; a whole
safetensors file that is no pickle passes. A folder's pickle files are scanned at every depth (a
job may load ``a/b/c/x.pt`` as well as ``x.pt``; a link out of the folder refuses it: .folderlinks): those named
so (``*.pt``, ``*.pth``, ``*.bin``, ``*.pkl``, ``*.pickle``, ``*.ckpt``, and those compressed:
a compressed one read through its decompressor: :mod:`.npyscan`), numpy's ``*.npy`` / ``*.npz`` (an
object array is a pickle: :mod:`.npyscan`), every DCP ``.metadata`` (loaded with a plain
``pickle.load``; DCP's data classes allowed by name) and a DCP save's byte items (:mod:`.dcpscan`),
and every other file whose first bytes may start one (:func:`sniffed`: ``model.pth.tar`` or
``weights`` are loaded by their content, not their name). The walk is bounded: ``MAX_ENTRIES``
directory entries looked at, ``MAX_SNIFFED`` files sniffed, ``MAX_FILES`` pickle files.
Why this and not picklescan or fickling: both are *denylist* scanners (they flag known-dangerous
imports such as ``os.system`` and pass the rest), while the job's ``weights_only`` load is an
*allowlist*; a denylist passes a callable it has not heard of. An allowlist walk is fail-closed,
small, and needs no new dependency (fickling also pulls in its own decompiler).
"""
from __future__ import annotations

import os
import pickletools
import struct
import tarfile
import zipfile
import zlib
from pathlib import Path
from typing import IO, Callable, cast

from .dcpscan import (DCP_METADATA, MAX_METADATA_BYTES, METADATA_OPCODES, SET_OPS, WHOLE_METADATA_BYTES, dcp_data,
                      scan_byte_items)
from ..errors import SupervisorError
from .folderlinks import LinkedOut, link_out
from .pickledeny import RUNS_CODE, Refusal, names_code
from .layouts import registry
from .npyscan import (COMPRESSION_ERRORS, MAX_NPZ_MEMBERS, NPY_MAGIC, NUMPY_SUFFIXES, compression_of, decompressed_head,
                      numpy_reconstruct, scan_compressed, scan_npy)
from .picklenames import ELEMENT_SIZE, RNG_PREFIX, allowed, numpy_data
from .picklestream import BoundedReader, Budget, Stream, Unreadable, read_stream, read_whole
from .structure import ZIP_MAGIC, structure_problem
from .zipstrict import check_zip

PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".pkl", ".pickle", ".ckpt")
# A pickle compressed (a job may gzip.open + pickle.load it): read through its decompressor within
# the budget (.zst / .lz4: no reader, so not called checked; see .npyscan).
COMPRESSED_PICKLES = tuple(s + z for s in PICKLE_SUFFIXES for z in (".gz", ".bz2", ".xz", ".zst", ".lz4"))
# Files of other names the walk opens to sniff (SNIFF_BYTES each): a folder of more is not called
# checked. 512 bytes walk in about 0.5 ms at most (an ordinary file breaks off within a few).
MAX_SNIFFED = 2_000
SNIFF_BYTES = 512
# DCP's data files (raw tensor bytes at the offsets .metadata gives) are not read whole by any
# loader: not sniffed; their byte items are read where .metadata places them (:mod:`.dcpscan`).
NOT_SNIFFED = (".distcp", ".safetensors")
# What makes unpickling call something: a callable comes only from an import (or the loader's
# persistent_load); a stream that breaks off before any of these has run nothing.
_CALLS = frozenset({"GLOBAL", "INST", "STACK_GLOBAL", "OBJ", "NEWOBJ", "NEWOBJ_EX", "REDUCE", "BUILD", "PERSID",
                    "BINPERSID", "EXT1", "EXT2", "EXT4"})
MAX_FILES = 10_000  # a folder with more pickle files is not called checked: 3,000 HF .bin shards scan in 0.5 s
# Entries (files and folders, at every depth) the folder walk looks at: a folder of more is not
# called checked. A listing costs about 1-3 µs an entry: 0.3 s at most on a loaded machine.
MAX_ENTRIES = 100_000
MAX_TAR_MEMBERS = 64  # torch's tar has three (storages, tensors, pickle)
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # torch.serialization.MAGIC_NUMBER, a legacy file's first pickle
def _also_allowed(path: Path) -> Callable[[str, str], bool]:
    """What a file may import beyond the tensor-rebuild allowlist, by the role its name gives it."""
    if path.name.startswith(RNG_PREFIX):
        return numpy_data
    if path.name == DCP_METADATA:
        return dcp_data
    return lambda module, name: False


class _Refused(SupervisorError):
    """A stream imports something outside the allowlist (the message says what)."""


def _checker(where: str, also: Callable[[str, str], bool]) -> Callable[[str | None], None]:
    """Judges each import as the walk meets it: a loader runs a REDUCE before it reads on, so a
    stream that breaks off later is refused for what it imported before."""
    def check(g: str | None) -> None:
        if g is None:
            raise _Refused(f"{where}: the pickle imports a callable whose name is only known at load time "
                           "(STACK_GLOBAL on computed operands, or a copyreg extension code)")
        module, _, name = g.rpartition(".")
        if names_code(module, name):
            raise _Refused(f"{where}: the pickle references {g}, {RUNS_CODE} (never in the tensor-rebuild allowlist)")
        if not allowed(module, name) and not also(module, name):
            raise _Refused(f"{where}: the pickle references {g}, outside the tensor-rebuild allowlist")
    return check


def _one(r: BoundedReader, check: Callable[[str | None], None], what: str) -> Stream:
    s = read_stream(r, check)
    if s is None:
        raise Unreadable(f"it ends before {what}")
    return s


def _count(r: BoundedReader, check: Callable[[str | None], None], what: str) -> int:
    s = _one(r, check, what)
    if s.value is None or s.value < 0:
        raise Unreadable(f"{what} is not a plain count")
    return s.value


def _raw(r: BoundedReader, n: int) -> bytes:
    data = r.read(n)
    if len(data) != n:
        raise Unreadable("it ends inside a legacy torch record")
    return data


def _scan_pickles(r: BoundedReader, check: Callable[[str | None], None]) -> None:
    """torch.load's path for what is neither zip nor tar (every pickle protocol): a legacy torch
    file (five pickles, then raw storage bytes) or a plain pickle file (each stream to the end)."""
    first = read_stream(r, check)
    if first is None:
        raise Unreadable("an empty file")
    if first.value == LEGACY_MAGIC:
        for what in ("its protocol version", "its sys_info", "its data", "its storage keys"):
            _one(r, check, what)
        return  # then the storages' bytes, which torch reads as data and never unpickles
    while read_stream(r, check) is not None:
        pass


def _scan_tar(path: Path, budget: Budget, check: Callable[[str | None], None]) -> None:
    """torch < 0.4's tar format (torch.load still reads it, with weights_only=False only):
    ``storages`` (a count, then per storage a pickle naming its type and that many raw
    elements, then the views), ``tensors`` (a count, then per tensor a pickle and raw sizes),
    ``pickle`` (the data). Every pickle is walked; the raw parts are skipped by their lengths."""
    with tarfile.open(path, mode="r:", format=tarfile.PAX_FORMAT) as tar:
        members: dict[str, tarfile.TarInfo] = {}
        for _ in range(MAX_TAR_MEMBERS + 1):
            m = tar.next()
            if m is None:
                break
            if m.name in members:  # torch's tar.extract takes the last of a name: no honest save has two
                raise Unreadable(f"a tar file with two members named {m.name!r:.60}: readers may take either")
            members[m.name] = m
        else:
            raise Unreadable(f"a tar file of more than {MAX_TAR_MEMBERS} members")
        missing = [n for n in ("storages", "tensors", "pickle") if n not in members or not members[n].isfile()]
        if missing:
            raise Unreadable(f"a tar file without the legacy torch member(s) {', '.join(missing)}")

        def member(name: str) -> BoundedReader:
            f = tar.extractfile(members[name])
            assert f is not None  # a regular file (isfile above)
            return BoundedReader(f, budget)

        r = member("storages")
        for _ in range(_count(r, check, "the storage count")):
            types = _one(r, check, "a storage's type").imports
            kind = types[0].rpartition(".")[2].removesuffix("Storage") if len(types) == 1 and types[0] else ""
            if kind not in ELEMENT_SIZE:
                raise Unreadable(f"a storage of an unknown type ({', '.join(map(str, types)) or 'none'})")
            (numel,) = struct.unpack("<q", _raw(r, 8))
            r.skip(numel * ELEMENT_SIZE[kind])
        _one(r, check, "the storage views")
        r = member("tensors")
        for _ in range(_count(r, check, "the tensor count")):
            _one(r, check, "a tensor's key")
            (ndim,) = struct.unpack("<i", _raw(r, 4))
            if not 0 <= ndim <= 64:
                raise Unreadable(f"a tensor of {ndim} dimensions")
            _raw(r, 4 + 16 * ndim + 8)
        _one(member("pickle"), check, "its data")


def _scan_zip(path: Path | IO[bytes], name: str, budget: Budget, also: Callable[[str, str], bool]) -> None:
    """torch.save's zip: each ``*.pkl`` member (``<name>/data.pkl``; the tensors' bytes are
    members of their own, never unpickled); numpy's ``.npz``: each ``*.npy`` member (:mod:`.npyscan`)."""
    try:
        z = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, ValueError, EOFError) as exc:
        raise Unreadable(f"a zip file that cannot be read ({exc})") from None
    with z:
        assert z.fp is not None  # open until the with ends
        check_zip(z.fp, z)  # one archive, the one torch's reader reads, or not called checked
        # torch finds a member ignoring case (miniz): archive/DATA.PKL is its data.pkl too.
        pkls = [i for i in z.infolist() if i.filename.lower().endswith(".pkl")]
        npys = [i for i in z.infolist() if i.filename.endswith(".npy")]
        if not pkls and not npys:
            raise Unreadable("a zip file with no pickle in it (no data.pkl) and no .npy")
        if len(npys) > MAX_NPZ_MEMBERS:
            raise Unreadable(f"a zip of more than {MAX_NPZ_MEMBERS:,} .npy members (the scan's bound)")
        for info in pkls + npys:
            where = f"{name}:{info.filename}"
            with z.open(info) as f:
                if info in npys:
                    scan_npy(BoundedReader(f, budget), _checker(where, _or_numpy(also)))
                else:
                    _one(read_whole(f, budget), _checker(where, also), "its pickle")


def _or_numpy(also: Callable[[str, str], bool]) -> Callable[[str, str], bool]:
    """An object array's pickle may also rebuild numpy arrays of plain values (:mod:`.npyscan`)."""
    return lambda module, name: numpy_reconstruct(module, name) or also(module, name)


def _is_tar(path: Path) -> bool:
    """As torch.load decides, after the zip check: a file tarfile opens is read as a tar."""
    try:
        with tarfile.open(path, mode="r:", format=tarfile.PAX_FORMAT):
            return True
    except (tarfile.TarError, ValueError, EOFError):
        return False


def _identity(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return st.st_ino, st.st_size, st.st_mtime_ns


# A container's complaints (a bad CRC, a broken deflate, an encrypted member) are unreadable too.
_READ_ERRORS = (Unreadable, tarfile.TarError, struct.error, zipfile.BadZipFile, zlib.error, EOFError, ValueError,
                RuntimeError, NotImplementedError, *COMPRESSION_ERRORS)


def _judged(name: str, scan: Callable[[], None]) -> str | None:
    try:
        scan()
    except _Refused as exc:
        return str(exc)
    except _READ_ERRORS as exc:
        return (f"{name}: cannot be read as a pickle, a torch zip or a legacy torch file ({exc}), so it is "
                "not called checked")
    return None


def _scan_file(path: Path, budget: Budget) -> str | None:
    also = _also_allowed(path)
    before = _identity(path)

    def scan() -> None:
        with open(path, "rb") as f:
            head = f.read(len(NPY_MAGIC))
            kind = compression_of(head)
            if path.name == DCP_METADATA:
                f.seek(0)
                _scan_metadata(f, _checker(path.name, also))
            elif kind is not None:  # by its bytes: extra.gz is a gzip of a pickle as much as extra.pkl.gz
                scan_compressed(path, kind, budget, lambda r: _scan_pickles(r, _checker(path.name, also)))
            elif path.name.endswith(COMPRESSED_PICKLES) and not path.name.endswith((".gz", ".bz2", ".xz")):
                raise Unreadable(f"a {path.suffix} file (no decompressor in the standard library)")
            elif head.startswith(ZIP_MAGIC):
                _scan_zip(path, path.name, budget, also)
            elif head == NPY_MAGIC:
                f.seek(0)
                scan_npy(BoundedReader(f, budget), _checker(path.name, _or_numpy(also)))
            elif _is_tar(path):
                _scan_tar(path, budget, _checker(path.name, also))
            else:
                f.seek(0)
                try:
                    _scan_pickles(BoundedReader(f, budget), _checker(path.name, also))
                except Unreadable:
                    if path.suffix != ".safetensors" or structure_problem(path) is not None:
                        raise
                    # A whole safetensors file (a JSON header, then raw tensors) that is no
                    # pickle: nothing in it is code. What a pickle walk met first was judged.
    why = _judged(path.name, scan)
    return f"{path.name}: changed while it was checked" if why is None and _identity(path) != before else why


def _scan_metadata(f: IO[bytes], check: Callable[[str | None], None]) -> None:
    """A DCP ``.metadata``: one pickle (DCP's reader loads one), walked on a budget of its own
    (a large save's is millions of opcodes: not the checkpoint's budget), no set in it."""
    size = os.fstat(f.fileno()).st_size
    if size > MAX_METADATA_BYTES:  # refused before a byte of it is held (a sparse 6 GB one)
        raise Unreadable(f"{size:,} bytes, past the {MAX_METADATA_BYTES >> 20} MiB a .metadata may be (the scan's bound)")
    budget = Budget(MAX_METADATA_BYTES, METADATA_OPCODES)
    # Held whole up to a bound (a third faster), read from the file past it (constant memory).
    r = read_whole(f, budget) if size <= WHOLE_METADATA_BYTES else BoundedReader(f, budget)
    if read_stream(r, check, refused=SET_OPS) is None:
        raise Unreadable("an empty file")
    if not r.at_end():
        raise Unreadable("more than one pickle in it (DCP's reader loads one)")


def _scan_item(f: IO[bytes], where: str, budget: Budget) -> str | None:
    """One DCP byte item, as DCP's reader loads it (``torch.load`` of its bytes: a torch zip, else
    legacy pickles), judged as a file is; numpy's plain arrays allowed (an rng state)."""
    also = _or_numpy(lambda module, name: False)

    def scan() -> None:
        if f.read(len(ZIP_MAGIC)) == ZIP_MAGIC:
            f.seek(0)
            _scan_zip(f, where, budget, also)
        else:
            f.seek(0)
            _scan_pickles(read_whole(f, budget), _checker(where, also))
    return _judged(where, scan)


class _TooMany(SupervisorError):
    """The folder holds more than the walk looks at (the message says what)."""


class _Cut(SupervisorError):
    """The sniffed bytes end where the file goes on: what follows may be anything."""

    def __init__(self) -> None:
        super().__init__("the sniffed bytes end where the file goes on")


class _Window:
    """The first bytes of a file, read as genops reads (``read``, ``readline``): a read past them
    that the file could satisfy is :class:`_Cut`; one past the file's end is short, as a
    loader's would be (genops then says the stream is broken)."""

    def __init__(self, head: bytes, size: int) -> None:
        self.head, self.size, self.pos = head, size, 0

    def read(self, n: int) -> bytes:
        if 0 <= n and self.pos + n > len(self.head) and self.pos + n <= self.size:
            raise _Cut
        data = self.head[self.pos:self.pos + max(n, 0)]
        self.pos += len(data)
        return data

    def readline(self) -> bytes:
        end = self.head.find(b"\n", self.pos)
        if end < 0 and len(self.head) < self.size:
            raise _Cut
        end = len(self.head) if end < 0 else end + 1
        data, self.pos = self.head[self.pos:end], end
        return data


def sniffed(path: str) -> bool:
    """Whether a file of another name may be something ``torch.load`` or ``pickle.load`` reads:
    a zip (``PK\\x03\\x04``), a tar (``ustar`` at 257), a PROTO opcode (0x80), or, since protocol
    0 and 1 have no marker, opcodes that reach an import or a call, or run past the sniffed bytes.
    Bytes that break off (an unknown opcode, a bad argument, a length past the file's end) before
    any import cannot make a loader run anything: text (``global_step100``, a README), JSON, raw
    data; nor can whole pickles of plain data (no import in them)."""
    with open(path, "rb") as f:
        head = f.read(SNIFF_BYTES)
        size = os.fstat(f.fileno()).st_size
    kind = compression_of(head)
    if kind is not None:  # what a gzip.open + pickle.load reads: its first decompressed bytes
        try:
            head = decompressed_head(Path(path), kind, SNIFF_BYTES + 1)
        except (OSError, EOFError, *COMPRESSION_ERRORS):
            return False  # no loader reads it whole either
        if head[257:262] == b"ustar":
            return False  # a tar inside (a code.tar.gz snapshot): an archive, not a pickle
        size = len(head) if len(head) <= SNIFF_BYTES else 1 << 62  # goes on: what follows may be anything
        head = head[:SNIFF_BYTES]
    if head.startswith((ZIP_MAGIC, b"\x80")) or head[257:262] == b"ustar":
        return True
    window = _Window(head, max(size, len(head)))
    try:
        while window.pos < window.size:  # each stream in turn: a loader may read on after a STOP
            for op, _arg, _pos in pickletools.genops(cast(IO[bytes], window)):
                if op.name in _CALLS:
                    return True
    except _Cut:
        return True
    except (ValueError, EOFError, OverflowError, TypeError, UnicodeDecodeError):
        return False
    return False


def _pickle_files(root: Path) -> list[Path]:
    """Every pickle file (by its name or by :func:`sniffed`) and DCP ``.metadata`` under ``root``,
    at every depth, in a stable order, within the walk's bounds (:class:`_TooMany` past them).
    Links to folders are not followed; one out of ``root`` refuses it (:class:`.folderlinks.LinkedOut`: a
    loader would read its files); a link to a file is scanned as the file it names. What the resume never reads is never handed over either:
    the layouts' skip list (HF's training_args.bin, a pickle of the TrainingArguments class) is
    skipped, as the load test skips it."""
    files: list[Path] = []
    seen, sniffs, home, todo = 0, 0, root.resolve(), [root]
    while todo:
        folder = todo.pop()
        with os.scandir(folder) as it:
            entries = []
            for e in it:
                seen += 1
                if seen > MAX_ENTRIES:
                    raise _TooMany(f"more than {MAX_ENTRIES:,} entries in its folders")
                entries.append(e)
        for e in sorted(entries, key=lambda e: e.name):
            if e.is_dir(follow_symlinks=False):
                todo.append(Path(e.path))
            elif why := link_out(root, home, e):
                raise LinkedOut(Path(e.path).relative_to(root).as_posix(), why)
            elif e.name in registry.NEVER or not e.is_file():
                continue
            elif e.name.endswith(PICKLE_SUFFIXES + COMPRESSED_PICKLES + NUMPY_SUFFIXES) or e.name == DCP_METADATA:
                files.append(Path(e.path))
            elif not e.name.endswith(NOT_SNIFFED):
                sniffs += 1
                if sniffs > MAX_SNIFFED:
                    raise _TooMany(f"more than {MAX_SNIFFED:,} files of other names to look into")
                if not sniffed(e.path):
                    continue
                files.append(Path(e.path))
            else:
                continue
            if len(files) > MAX_FILES:
                raise _TooMany(f"more than {MAX_FILES:,} pickle files, the most the scan reads")
    return files


def unsafe_pickle(path: Path, budget: Budget | None = None) -> str | None:
    """Why ``path`` is not handed over on its structural checks alone, or None: unpickling it could
    run code outside the tensor-rebuild allowlist, or it cannot be read and so was not checked (an
    unknown format, a stream cut short, past the bound, changed while read). One :class:`Budget`."""
    refusal = scan_refusal(path, budget)
    return refusal.why if refusal is not None else None


def scan_refusal(path: Path, budget: Budget | None = None) -> Refusal | None:
    """:func:`unsafe_pickle` with the refused file named apart, for :func:`.pickledeny.scan_verdict`."""
    budget = budget or Budget()
    try:
        if path.is_file():
            why = _scan_file(path, budget)
            return Refusal(path.name, why) if why else None
        if not path.is_dir():
            return Refusal(path.name, f"{path.name}: neither a regular file nor a folder, so it is not called checked")
        try:
            files = _pickle_files(path)
        except _TooMany as exc:
            return Refusal(path.name, f"{path.name}: {exc}, so it is not called checked")
        except LinkedOut as exc:
            return Refusal(exc.rel, exc.why)
        for p in files:
            why = _scan_file(p, budget)
            if why:
                rel = p.relative_to(path)
                # Named by its place in the folder: a.pt three levels down is not the top one.
                return Refusal(rel.as_posix(), why if rel.parent == Path(".") else f"{rel.parent}/{why}")
        if (path / DCP_METADATA).is_file():  # a DCP save: its byte items, where .metadata puts them
            return scan_byte_items(path, lambda f, where: _scan_item(f, where, budget))
    except OSError as exc:
        return Refusal(path.name, f"{path.name}: cannot be read now ({exc.strerror or exc}), so it is not called checked",
                       transient=True)
    return None
