"""A zip read as torch's reader reads it, or refused: the pickle scan must see the bytes the job loads.

Python's :mod:`zipfile` (the scan's reader) and torch's (``PyTorchStreamReader``, on miniz) find
the end-of-central-directory record the same way (the last ``PK\\x05\\x06`` with 22 bytes after it),
but then part ways: zipfile corrects every offset for data in front of the archive (its ``concat``,
``end record - directory size - directory offset``), miniz takes the directory's offset as
absolute. Two torch zips of the same length glued together (issue 34 D1) are then two archives: the
scan read the second (harmless), torch loaded the first (an ``os.system`` payload). So before a
member is read the archive must be one that both readers read alike, else it is not called checked:

- the end record reaches the file's end (no bytes after it), one of it after the directory, on disk 0;
- the central directory ends right where the end record (or the zip64 record its locator names,
  just before the locator, 56 bytes) begins: no data before the archive (zipfile's ``concat`` 0);
- every directory entry parses (zip64 extra fields included) and the entries fill the directory
  exactly, as many as the end record counts; no two names alike, ignoring case (miniz's lookup
  ignores case), none with a NUL byte (zipfile cuts a name there, miniz does not);
- every entry's local header is where the directory says, names the same name and method, and its
  sizes agree where it states them (a data descriptor's entry may state none); the first starts at
  byte 0; headers and data of the entries never overlap and end before the directory;
- zipfile's own reading of the directory names the same entries at the same offsets and sizes.

Bound: the directory is read whole up to :data:`MAX_DIRECTORY_BYTES` (zipfile reads it whole too),
then 30 bytes and the name of each local header (a torch zip of 50,000 parameters: about 0.3 s).
"""
from __future__ import annotations

import os
import struct
import zipfile
from dataclasses import dataclass
from typing import IO

from .picklestream import Unreadable

MAX_DIRECTORY_BYTES = 64 << 20
_EOCD, _CDH, _LFH = b"PK\x05\x06", b"PK\x01\x02", b"PK\x03\x04"
_Z64_LOCATOR, _Z64_EOCD = b"PK\x06\x07", b"PK\x06\x06"
_EOCD_SIZE, _LOCATOR_SIZE, _Z64_SIZE, _CDH_SIZE, _LFH_SIZE = 22, 20, 56, 46, 30
_FULL32, _FULL16 = 0xFFFFFFFF, 0xFFFF
_TWO_READERS = "another reader (torch's) may see another archive"


@dataclass(frozen=True)
class _Entry:
    name: bytes
    flags: int
    method: int
    csize: int
    usize: int
    offset: int


def _at(f: IO[bytes], pos: int, n: int) -> bytes:
    f.seek(pos)
    data = f.read(n)
    if len(data) != n:
        raise Unreadable("a zip whose records run past the end of the file")
    return data


def _end_record(f: IO[bytes], size: int) -> tuple[int, bytes]:
    """The end record's place and bytes, found as miniz finds it (the last signature with a whole
    record after it, within the 64 KiB a comment may take)."""
    start = max(0, size - (_FULL16 + _EOCD_SIZE))
    tail = _at(f, start, size - start)
    pos = tail.rfind(_EOCD, 0, len(tail) - _EOCD_SIZE + 4)
    if pos < 0:
        raise Unreadable("a zip without an end-of-central-directory record")
    rec = tail[pos:pos + _EOCD_SIZE]
    (comment,) = struct.unpack("<H", rec[20:22])
    if pos + _EOCD_SIZE + comment != len(tail):
        raise Unreadable(f"a zip with bytes after its end record: {_TWO_READERS}")
    return start + pos, rec


def _directory_place(f: IO[bytes], size: int) -> tuple[int, int, int, int]:
    """(directory offset, its size, its entry count, where it must end), the zip64 record preferred
    as both readers prefer it."""
    eocd, rec = _end_record(f, size)
    disk, cd_disk, n_disk, n_total, cd_size, cd_off = struct.unpack("<HHHHII", rec[4:20])
    end = eocd
    if eocd >= _LOCATOR_SIZE + _Z64_SIZE and _at(f, eocd - _LOCATOR_SIZE, 4) == _Z64_LOCATOR:
        loc = _at(f, eocd - _LOCATOR_SIZE, _LOCATOR_SIZE)
        (z64_at,) = struct.unpack("<Q", loc[8:16])
        end = eocd - _LOCATOR_SIZE - _Z64_SIZE
        if z64_at != end:  # zipfile looks just before the locator, miniz where the locator says
            raise Unreadable(f"a zip whose zip64 locator points away from its zip64 record: {_TWO_READERS}")
        z64 = _at(f, end, _Z64_SIZE)
        rec_size, _, _, disk32, cd_disk32, n_disk, n_total, cd_size, cd_off = struct.unpack("<QHHIIQQQQ", z64[4:])
        if z64[:4] != _Z64_EOCD or rec_size != _Z64_SIZE - 12:
            raise Unreadable(f"a zip whose zip64 end record is missing or of another size: {_TWO_READERS}")
        disk, cd_disk = disk32, cd_disk32
    if disk or cd_disk or n_disk != n_total:
        raise Unreadable("a zip split over several disks")
    if cd_off + cd_size != end:
        what = "data before its archive" if cd_off + cd_size < end else "a central directory past its end record"
        raise Unreadable(f"a zip with {what}: {_TWO_READERS}")
    if cd_size > MAX_DIRECTORY_BYTES:
        raise Unreadable(f"a zip directory of {cd_size:,} bytes, past the {MAX_DIRECTORY_BYTES >> 20} MiB "
                         "the scan reads (its bound)")
    if _EOCD in _at(f, cd_off, eocd - cd_off):
        raise Unreadable(f"a zip with more than one end-of-central-directory record: {_TWO_READERS}")
    return cd_off, cd_size, n_total, end


def _zip64_extra(extra: bytes, csize: int, usize: int, offset: int) -> tuple[int, int, int]:
    """The 64-bit values a zip64 extra field holds for the fields saturated in the entry."""
    i = 0
    while i + 4 <= len(extra):
        tag, n = struct.unpack("<HH", extra[i:i + 4])
        if tag == 1:
            body, j = extra[i + 4:i + 4 + n], 0
            vals = []
            for v in (usize, csize, offset):
                if v == _FULL32:
                    if j + 8 > len(body):
                        raise Unreadable("a zip whose zip64 extra field is short")
                    v = struct.unpack("<Q", body[j:j + 8])[0]
                    j += 8
                vals.append(v)
            return vals[1], vals[0], vals[2]
        i += 4 + n
    if _FULL32 in (csize, usize, offset):
        raise Unreadable("a zip entry of saturated sizes without a zip64 extra field")
    return csize, usize, offset


def _directory(data: bytes, count: int) -> list[_Entry]:
    out, pos = [], 0
    for _ in range(count):
        if data[pos:pos + 4] != _CDH or pos + _CDH_SIZE > len(data):
            raise Unreadable("a zip whose central directory holds fewer entries than its end record counts")
        (flags, method, csize, usize, nlen, xlen, clen, disk, offset) = struct.unpack(
            "<HH8xIIHHHH6xI", data[pos + 8:pos + _CDH_SIZE])
        name = data[pos + _CDH_SIZE:pos + _CDH_SIZE + nlen]
        extra = data[pos + _CDH_SIZE + nlen:pos + _CDH_SIZE + nlen + xlen]
        pos += _CDH_SIZE + nlen + xlen + clen
        if pos > len(data) or disk not in (0, _FULL16):
            raise Unreadable("a zip whose central directory entry runs past the directory")
        csize, usize, offset = _zip64_extra(extra, csize, usize, offset)
        out.append(_Entry(name, flags, method, csize, usize, offset))
    if pos != len(data):
        raise Unreadable(f"a zip whose central directory holds more than its end record counts: {_TWO_READERS}")
    return out


def _local(f: IO[bytes], e: _Entry) -> int:
    """Checks an entry's local header against the directory; where its data ends."""
    head = _at(f, e.offset, _LFH_SIZE)
    if head[:4] != _LFH:
        raise Unreadable(f"a zip entry ({e.name!r:.80}) whose local header is not where the directory says")
    flags, method, csize, usize, nlen, xlen = struct.unpack("<2xHH8xIIHH", head[4:])
    if _at(f, e.offset + _LFH_SIZE, nlen) != e.name or method != e.method:
        raise Unreadable(f"a zip entry ({e.name!r:.80}) whose local header names another member: {_TWO_READERS}")
    stated = not (flags & 0x08 and csize == usize == 0) and _FULL32 not in (csize, usize)
    if stated and (csize, usize) != (e.csize, e.usize):
        raise Unreadable(f"a zip entry ({e.name!r:.80}) whose local sizes disagree with its directory: {_TWO_READERS}")
    return e.offset + _LFH_SIZE + nlen + xlen + e.csize


def check_zip(f: IO[bytes], z: zipfile.ZipFile) -> None:
    """Raises :class:`Unreadable` unless ``f`` (opened as ``z``) is one archive both readers read alike."""
    size = f.seek(0, os.SEEK_END)
    cd_off, cd_size, count, _ = _directory_place(f, size)
    entries = _directory(_at(f, cd_off, cd_size), count)
    names = [e.name.lower() for e in entries]
    if len(set(names)) != len(names):
        raise Unreadable(f"a zip with two members of one name (ignoring case): {_TWO_READERS}")
    if any(b"\0" in n for n in names):
        raise Unreadable(f"a zip member name with a NUL byte: {_TWO_READERS}")
    end = 0
    for i, e in enumerate(sorted(entries, key=lambda e: e.offset)):
        if i == 0 and e.offset != 0:
            raise Unreadable(f"a zip with data before its archive: {_TWO_READERS}")
        if e.offset < end:
            raise Unreadable(f"a zip whose members overlap: {_TWO_READERS}")
        end = _local(f, e)
    if end > cd_off:
        raise Unreadable(f"a zip whose last member runs into its central directory: {_TWO_READERS}")
    theirs = [(i.orig_filename, i.header_offset, i.compress_size, i.file_size) for i in z.infolist()]
    ours = [(e.name.decode("utf-8" if e.flags & 0x800 else "cp437"), e.offset, e.csize, e.usize) for e in entries]
    if theirs != ours:
        raise Unreadable(f"a zip that Python's zipfile reads otherwise than its directory says: {_TWO_READERS}")
