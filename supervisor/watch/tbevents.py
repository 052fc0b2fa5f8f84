"""TensorBoard event files (``events.out.tfevents.*``) -> :class:`~supervisor.events.MetricRecord`.

Why a reader of our own, in pure stdlib: the daemon stays light (it never imports torch, grpc or
protobuf). TensorBoard's own ``EventAccumulator`` pulls in its TF-compat stack and protobuf,
``tbparse`` pulls in pandas, and both read whole files, not a file that is still being written.
The format is tiny and has been stable for a decade:

- TFRecord framing, each record: ``u64 length`` (little endian), ``u32 masked_crc32c(length
  bytes)``, ``payload``, ``u32 masked_crc32c(payload)``.
- the payload is an ``Event`` protobuf: ``wall_time=1`` (double), ``step=2`` (int64),
  ``summary=5`` {``value=1`` repeated {``tag=1``, ``simple_value=2`` (float),
  ``tensor=8`` TensorProto {``dtype=1``, ``tensor_content=4``, ``float_val=5``, ``double_val=6``,
  ``int_val=7``, ``int64_val=10``, ``half_val=13``}}}. Everything else is skipped by wire type.

:class:`TBReader` is incremental: ``read(data)`` takes the bytes appended since the last call
and returns the scalars of every complete record. A partial record at the tail is "not written
yet" (kept for the next call); a record whose payload CRC fails is skipped (counted, the caller
warns once); a length whose CRC fails means we lost the framing, so the reader looks for the
next offset whose length CRC holds (a torn write, or a file first read from a non-zero offset).

Tags -> record fields: :func:`tag_field` (Lightning ``train_loss`` / ``train_loss_step`` /
``val_loss``, HF ``train/loss`` / ``train/grad_norm`` / ``train/learning_rate`` / ``eval/loss``,
``torch.utils.tensorboard`` habits ``Loss/train`` / ``Loss/val`` / ``loss``). Scalars keep the
step the writer gave them; those of one step read in one call make one record (:func:`group`).
"""

from __future__ import annotations

import dataclasses
import re
import struct
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import google_crc32c

from ..core.observations import MetricRecord
from ..errors import SupervisorError
from .records import canonical_key, make_record

def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) in C (google-crc32c): the pure-Python table loop cost about 0.7 of a
    core for hours on a corrupt file, whose resync checks a CRC at many offsets."""
    return int(google_crc32c.value(data))


def masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


# -- protobuf wire format ------------------------------------------------------------------------

class WireError(SupervisorError, ValueError):
    """The payload is not valid protobuf wire format (a ValueError too, as a parser's error is)."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise WireError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def fields(buf: bytes) -> Iterator[tuple[int, int, object]]:
    """(field number, wire type, value) of each field: varint -> int, fixed64 / fixed32 -> the raw
    8 / 4 bytes, length-delimited -> bytes."""
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = _varint(buf, pos)
        num, wt = key >> 3, key & 7
        if wt == 0:
            val, pos = _varint(buf, pos)
            yield num, wt, val
        elif wt == 1:
            if pos + 8 > end:
                raise WireError("truncated fixed64")
            yield num, wt, buf[pos:pos + 8]
            pos += 8
        elif wt == 2:
            n, pos = _varint(buf, pos)
            if pos + n > end:
                raise WireError("truncated bytes field")
            yield num, wt, buf[pos:pos + n]
            pos += n
        elif wt == 5:
            if pos + 4 > end:
                raise WireError("truncated fixed32")
            yield num, wt, buf[pos:pos + 4]
            pos += 4
        else:  # groups (3, 4) are not used by any summary message
            raise WireError(f"unsupported wire type {wt}")


def _signed64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


# TensorProto dtypes that hold a scalar we can read.
_DT_FLOAT, _DT_DOUBLE, _DT_INT32, _DT_INT64, _DT_HALF = 1, 2, 3, 9, 19
_CONTENT_FMT = {_DT_FLOAT: "<f", _DT_DOUBLE: "<d", _DT_INT32: "<i", _DT_INT64: "<q", _DT_HALF: "<e"}


def _tensor_scalar(buf: bytes) -> float | None:
    """The first element of a TensorProto (``add_scalar(new_style=True)``, TF2 summaries)."""
    dtype = 0
    content: bytes | None = None
    for num, wt, val in fields(buf):
        if num == 1 and wt == 0:
            dtype = int(val)  # type: ignore[call-overload]
        elif num == 4 and wt == 2:
            content = val  # type: ignore[assignment]
        elif num == 5:  # float_val: packed (wt 2) or one (wt 5)
            raw = val if wt == 5 else val[:4]  # type: ignore[index]
            if len(raw) == 4:  # type: ignore[arg-type]
                return float(struct.unpack("<f", raw)[0])  # type: ignore[arg-type]
        elif num == 6:
            raw = val if wt == 1 else val[:8]  # type: ignore[index]
            if len(raw) == 8:  # type: ignore[arg-type]
                return float(struct.unpack("<d", raw)[0])  # type: ignore[arg-type]
        elif num in (7, 10) and wt == 0:
            return float(_signed64(int(val)))  # type: ignore[call-overload]
        elif num == 13 and wt == 0:  # half_val: the 16 bits in an int32
            return float(struct.unpack("<e", struct.pack("<H", int(val) & 0xFFFF))[0])  # type: ignore[call-overload]
    fmt = _CONTENT_FMT.get(dtype)
    if content is not None and fmt is not None and len(content) >= struct.calcsize(fmt):
        return float(struct.unpack_from(fmt, content)[0])
    return None


@dataclass(frozen=True)
class Scalar:
    """One scalar summary value of one event."""

    step: int
    tag: str
    value: float
    wall_time: float


def parse_event(payload: bytes) -> list[Scalar]:
    """The scalars of one ``Event`` payload (none for file_version, graphs, images, ...)."""
    wall, step = 0.0, 0
    summaries: list[bytes] = []
    for num, wt, val in fields(payload):
        if num == 1 and wt == 1:
            wall = struct.unpack("<d", val)[0]  # type: ignore[arg-type]
        elif num == 2 and wt == 0:
            step = _signed64(int(val))  # type: ignore[call-overload]
        elif num == 5 and wt == 2:
            summaries.append(val)  # type: ignore[arg-type]
    out: list[Scalar] = []
    for summary in summaries:
        for num, wt, val in fields(summary):
            if num != 1 or wt != 2:
                continue
            tag, value = "", None
            for vn, vwt, vv in fields(val):  # type: ignore[arg-type]
                if vn == 1 and vwt == 2:
                    tag = bytes(vv).decode("utf-8", "replace")  # type: ignore[call-overload]
                elif vn == 2 and vwt == 5:
                    value = float(struct.unpack("<f", vv)[0])  # type: ignore[arg-type]
                elif vn == 8 and vwt == 2:
                    value = _tensor_scalar(vv)  # type: ignore[arg-type]
            if tag and value is not None:
                out.append(Scalar(step, tag, value, wall))
    return out


# -- TFRecord framing ------------------------------------------------------------------------------

_HEADER = 12  # u64 length + u32 its masked CRC
_MAX_RECORD = 64 << 20  # no event is this big; a length above it is a lost framing
#: A record longer than this is passed over unread and unkept: a scalar event is a few hundred
#: bytes (images and histograms are the big ones), and a reader holds at most this much of one.
KEEP_RECORD = 1 << 20
#: Length CRCs tried per second per file while looking for the framing again (a corrupt file):
#: a few ms of a core. Past it the reader waits for the budget; what it holds stays bounded.
RESYNC_CHECKS_PER_S = 20_000
# Where a header can start: the 8 length bytes (little endian) of a length <= _MAX_RECORD end in
# a byte <= 4 and four zeros; found at C speed, so only those offsets cost a CRC.
_CANDIDATE = re.compile(rb"[\x00-\x04]\x00\x00\x00\x00")
_ZEROS = bytes(_HEADER)
_ZERO_BLOCKS = (bytes(1 << 16), bytes(1 << 12))


def _zeros_end(buf: bytes, p: int) -> int:
    """The first offset at or after ``p`` whose byte is not zero (``len(buf)`` if none): blocks
    compared with memcmp, ~10 GB/s (a regex or ``lstrip`` walks the bytes at ~200 MB/s)."""
    n = len(buf)
    for zeros in _ZERO_BLOCKS:
        step = len(zeros)
        while p + step <= n and buf[p:p + step] == zeros:
            p += step
    rest = buf[p:p + len(_ZERO_BLOCKS[-1])]
    return p + len(rest) - len(rest.lstrip(b"\x00"))


class TBReader:
    """Incremental reader of one event file: feed it the bytes appended, get its scalars back.

    Bounded: it holds at most one record (``KEEP_RECORD``, bigger ones are passed over) plus the
    bytes of the last call, and a lost framing is looked for at ``resync_checks_per_s`` CRCs a
    second at most (``throttled`` while it waits: feed it ``b""`` until it is not)."""

    def __init__(self, resync_checks_per_s: float = RESYNC_CHECKS_PER_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._buf = b""
        self._skip = 0  # bytes of an oversized record still to pass over
        self.records = 0
        self.corrupt = 0  # records skipped (payload CRC, bad protobuf) or framing resyncs
        self.oversized = 0  # records passed over unread (longer than KEEP_RECORD)
        self.last_error: str | None = None
        self.rate = resync_checks_per_s
        self.clock = clock
        self._tokens = resync_checks_per_s
        self._refilled = clock()
        self._resyncing = False  # the framing is lost: the next offsets are searched (throttled)
        self.throttled = False

    @property
    def pending(self) -> int:
        """Bytes of an incomplete record kept for the next call."""
        return len(self._buf)

    def read(self, data: bytes) -> list[Scalar]:
        if self._skip:
            n = min(self._skip, len(data))
            self._skip -= n
            data = data[n:]
        buf = self._buf + data if self._buf else data
        pos, end = 0, len(buf)
        out: list[Scalar] = []
        self.throttled = False
        while end - pos >= _HEADER:
            if self._resyncing:
                pos, budget_left = self._resync(buf, pos)
                if not budget_left:  # go on from here when it refills
                    self.throttled = True
                    break
                if end - pos < _HEADER:
                    break
            head = buf[pos:pos + 8]
            (length,) = struct.unpack("<Q", head)
            (len_crc,) = struct.unpack_from("<I", buf, pos + 8)
            if len_crc != masked_crc(head) or length > _MAX_RECORD:
                if not self._resyncing:
                    self._bad("the length of a record fails its CRC (a torn write?): looking for the next record")
                self._resyncing = True
                pos += 1
                continue
            self._resyncing = False
            stop = pos + _HEADER + length + 4
            if length > KEEP_RECORD:  # not a scalar: pass over it without keeping it
                self.oversized += 1
                self._skip = max(0, stop - end)
                pos = min(stop, end)
                continue
            if stop > end:
                break  # not written yet: read it next time
            payload = buf[pos + _HEADER:pos + _HEADER + length]
            (data_crc,) = struct.unpack_from("<I", buf, stop - 4)
            pos = stop
            if data_crc != masked_crc(payload):
                self._bad("a record fails its CRC: skipped")
                continue
            try:
                out.extend(parse_event(payload))
            except (WireError, struct.error, UnicodeDecodeError) as exc:
                self._bad(f"a record is not an Event ({exc}): skipped")
                continue
            self.records += 1
        self._buf = buf[pos:]
        return out

    def _bad(self, why: str) -> None:
        self.corrupt += 1
        self.last_error = why

    def _spend(self) -> bool:
        if self._tokens < 1.0:
            now = self.clock()
            self._tokens = min(self.rate, self._tokens + (now - self._refilled) * self.rate)
            self._refilled = now
            if self._tokens < 1.0:
                return False
        self._tokens -= 1.0
        return True

    def _resync(self, buf: bytes, start: int) -> tuple[int, bool]:
        """The next offset from ``start`` whose 8 length bytes carry a valid CRC; else the offset
        where fewer than a header's bytes are left (the next write may complete one). False with
        the offset reached when the CRC budget ran out."""
        last = len(buf) - _HEADER
        p = start
        while p <= last:
            m = _CANDIDATE.search(buf, p + 3)
            if m is None or m.start() - 3 > last:
                break
            p = m.start() - 3
            if buf[p:p + _HEADER] == _ZEROS:
                # A run of zeros (a sparse or preallocated file): no header starts inside it,
                # since the masked CRC of a zero length is not zero. Go to its end at C speed.
                nz = _zeros_end(buf, p)
                if nz == len(buf):
                    break
                p = max(p + 1, nz - _HEADER + 1)
                continue
            if not self._spend():
                return p, False
            head = buf[p:p + 8]
            if struct.unpack_from("<I", buf, p + 8)[0] == masked_crc(head) and struct.unpack("<Q", head)[0] <= _MAX_RECORD:
                return p, True
            p += 1
        return max(start, last + 1), True


# -- tags -> record fields -------------------------------------------------------------------------

_TRAIN = frozenset({"train", "training"})
_EVAL = frozenset({"eval", "val", "valid", "validation", "test_during_train"})


def tag_field(tag: str) -> tuple[str | None, bool]:
    """A scalar's tag -> (record field or None, is per step); see :func:`records.canonical_key`.

    ``train/loss`` and ``eval/loss`` are in the shared key table; ``Loss/train`` (the
    ``torch.utils.tensorboard`` tutorial's spelling) is read as ``train_loss``, ``Loss/val`` as
    ``val_loss``, ``train/train_loss`` (HF's run summary) as ``train_loss``."""
    canon, per_step = canonical_key(tag)
    if canon is not None:
        return canon, per_step
    low = tag.lower()
    if "/" in low:
        head, _, tail = low.rpartition("/")
        head = head.rpartition("/")[2]
        if head in _TRAIN:
            return canonical_key(tail)
        if head in _EVAL:
            return canonical_key("val_" + tail)
        if tail in _TRAIN:
            return canonical_key(head)
        if tail in _EVAL:
            return canonical_key("val_" + head)
        return canonical_key(tail)
    return canonical_key(low)


def group(scalars: Iterable[Scalar], source: str, fmt: str = "tensorboard") -> list[MetricRecord]:
    """Scalars -> one record per step (in the order steps first appear), its ``at`` the writer's
    wall time of the step's first scalar (the job's real rhythm, not when we read it); steps
    without a loss-like value (only ``epoch`` or ``lr``) make no record."""
    by_step: dict[int, tuple[dict[str, object], dict[str, float]]] = {}
    walls: dict[int, float] = {}
    for s in scalars:
        values, extra = by_step.setdefault(s.step, ({"step": s.step}, {}))
        walls.setdefault(s.step, s.wall_time)
        canon, per_step = tag_field(s.tag)
        if canon is not None and per_step and canon != "step":
            values.setdefault(canon, s.value)
        else:
            extra[s.tag] = s.value
    out: list[MetricRecord] = []
    for step, (values, extra) in by_step.items():
        rec = make_record(values, fmt, source, None, extra)
        if rec is not None:
            out.append(dataclasses.replace(rec, at=walls[step]) if walls[step] > 0 else rec)
    return out


def read_file(path: str) -> tuple[list[Scalar], TBReader]:
    """Every scalar of a whole event file (tests, tools)."""
    r = TBReader()
    with open(path, "rb") as f:
        scalars = r.read(f.read())
    return scalars, r


__all__ = ["Scalar", "TBReader", "crc32c", "group", "masked_crc", "parse_event", "read_file", "tag_field"]
