"""One pickle stream, walked statically and within a bound: which globals unpickling it would
import and, where the whole stream is one integer, its value (a legacy torch file's magic number,
a count of the legacy tar format). Nothing is imported or executed: :func:`pickletools.genops`
yields opcodes and their arguments, for every protocol (0-5; protocol 0 and 1 have no PROTO
opcode, so the first byte says nothing about whether a file is a pickle).

Fail-closed: a stream that does not run to its STOP opcode, an opcode genops does not know, a
name whose operands cannot be told statically, or a stream past the bound raises
:class:`Unreadable`, and what cannot be read is never called checked.

The bound, per checkpoint (one :class:`Budget` for all its files and streams; a DCP ``.metadata``
has one of its own, :mod:`.dcpscan`): at most ``MAX_PICKLE_BYTES`` read through the walk (an
argument that claims more, such as a BINBYTES8 of a terabyte, is refused before any memory is
taken for it) and ``MAX_OPCODES`` opcodes. Sized for real saves, measured (docs/reliability.md):
a torch zip of 50,000 parameters with their Adam state is 6 million opcodes and 17 MB of pickle,
walked in about 5 s of one core on the loaded 2-core machine (about 0.5-0.8 µs an opcode, a
stream held in memory: :class:`WholeReader`); 16 million opcodes are at most about 13 s. Past
either, the checkpoint is not called checked. The walk keeps two stack slots, the memo's key
count (and the keys a PUT scattered) and the name-like short strings it holds (what a
STACK_GLOBAL may fetch), at most ``MAX_MEMO`` of them (about 50 MiB); nesting depth costs
nothing: 5,000 nested lists are 10,000 opcodes like any others.
"""
from __future__ import annotations

import io
import pickletools
from dataclasses import dataclass
from typing import IO, Callable, cast

from ..errors import SupervisorError

MAX_PICKLE_BYTES = 64 << 20
MAX_OPCODES = 16_000_000
MAX_MEMO = 500_000
NAME_MAX = 200  # longer strings are never module or attribute names we allow: not kept in the memo

_STRING_OPS = frozenset({"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "STRING", "BINSTRING",
                         "SHORT_BINSTRING"})
_INT_OPS = frozenset({"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4"})
_PUT_OPS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
_GET_OPS = frozenset({"GET", "BINGET", "LONG_BINGET"})
_EXT_OPS = frozenset({"EXT1", "EXT2", "EXT4"})
_OFF_STACK = frozenset({"PROTO", "FRAME", "STOP"})  # framing: a frame may fall between a name's two parts


class Unreadable(SupervisorError):
    """Why a stream cannot be checked statically (the message names what was met)."""

    code = "pickle_unreadable"


class Budget:
    """What one checkpoint's scan may read and walk; shared by all its files (counters, mutable)."""

    def __init__(self, max_bytes: int = MAX_PICKLE_BYTES, max_ops: int = MAX_OPCODES) -> None:
        self.max_bytes, self.max_ops = max_bytes, max_ops
        self.bytes_left, self.ops_left = max_bytes, max_ops

    def spend_bytes(self, n: int) -> None:
        if n > self.bytes_left:
            raise Unreadable(f"more than {self.max_bytes >> 20} MiB of pickle data to walk (the scan's bound)")
        self.bytes_left -= n

    def spend_op(self) -> None:
        self.ops_left -= 1
        if self.ops_left < 0:
            raise Unreadable(f"more than {self.max_ops:,} pickle opcodes to walk (the scan's bound)")


class BoundedReader:
    """The reads genops makes (``read``, ``readline``), each counted against the budget before it
    is made, plus what the legacy formats need between streams (raw fields, skipped storage bytes)."""

    def __init__(self, f: IO[bytes], budget: Budget) -> None:
        self._f = f
        self.budget = budget
        self._pushback = b""

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            raise Unreadable("an unbounded read")  # genops never asks for one
        self.budget.spend_bytes(n)
        head, self._pushback = self._pushback[:n], self._pushback[n:]
        return head + self._f.read(n - len(head)) if n > len(head) else head

    def readline(self) -> bytes:
        """Protocol 0's newline-terminated arguments: at most what the budget has left."""
        head, self._pushback = self._pushback, b""
        if head.endswith(b"\n"):
            return head
        line = head + self._f.readline(self.budget.bytes_left + 1)
        self.budget.spend_bytes(len(line))
        return line

    def push_back(self, data: bytes) -> None:
        """Bytes already read (and counted) that the next read gives again."""
        self._pushback = data + self._pushback

    def at_end(self) -> bool:
        """True when no byte is left (a clean end between streams)."""
        if self._pushback:
            return False
        self._pushback = self._f.read(1)
        return not self._pushback

    def skip(self, n: int) -> None:
        """Raw bytes the loader reads as data, never as a pickle (legacy tar storages)."""
        if n < 0:
            raise Unreadable(f"a negative length ({n})")
        if n == 0:
            return
        if self._pushback:
            n -= 1
            self._pushback = b""
        self._f.seek(n, 1)


class WholeReader(BoundedReader):
    """A stream already read into memory within the budget (a zip's ``data.pkl``, a DCP
    ``.metadata`` or byte item): genops calls BytesIO's own ``read`` instead of a Python method an
    opcode, about a third of the walk's time on a large save. :func:`read_whole` makes one."""

    def __init__(self, data: bytes, budget: Budget) -> None:
        budget.spend_bytes(len(data))
        super().__init__(io.BytesIO(data), budget)
        self._bio = cast(io.BytesIO, self._f)
        self._size = len(data)
        self.read = self._bio.read  # type: ignore[method-assign,assignment]
        self.readline = self._bio.readline  # type: ignore[method-assign]

    def push_back(self, data: bytes) -> None:
        self._bio.seek(-len(data), 1)  # the bytes just read

    def at_end(self) -> bool:
        return self._bio.tell() >= self._size

    def skip(self, n: int) -> None:
        if n < 0:
            raise Unreadable(f"a negative length ({n})")
        self._bio.seek(n, 1)


def read_whole(f: IO[bytes], budget: Budget) -> WholeReader:
    """All of ``f`` in memory, at most the budget's bytes left (past them: Unreadable, nothing more read)."""
    chunks: list[bytes] = []
    held = 0
    while True:  # in chunks: a read(n) of a file allocates n bytes at once, however short the file
        chunk = f.read(1 << 20)
        if not chunk:
            return WholeReader(b"".join(chunks), budget)
        held += len(chunk)
        if held > budget.bytes_left:
            raise Unreadable(f"more than {budget.max_bytes >> 20} MiB of pickle data to walk (the scan's bound)")
        chunks.append(chunk)


@dataclass(frozen=True)
class Stream:
    """What one pickle stream holds for the scan."""

    imports: tuple[str | None, ...]  # each distinct module.name imported; None: computed at load time
    value: int | None  # the stream's value when it is one plain integer, else None


def _name_like(s: str) -> bool:
    """A string an import could be made of (dotted identifiers): only these are kept in the memo.
    A GET of any other string is not a name operand, so a STACK_GLOBAL on it is refused as
    computed at load time (fail-closed); a real save's memo of tensor keys ("12", "layers.0.w")
    then costs nothing."""
    return all(part.isidentifier() for part in s.split("."))


def read_stream(r: BoundedReader, check: Callable[[str | None], None],
                refused: frozenset[str] = frozenset()) -> Stream | None:
    """The next pickle stream of ``r``; None at a clean end of the data. Raises Unreadable, and
    whatever ``check`` raises: it is called on each import as the walk meets it (a loader runs a
    REDUCE before it reads on, so what a stream imports before it breaks off counts). ``refused``:
    opcodes this kind of stream never holds (a set in a DCP ``.metadata``: 200 bytes built a byte)."""
    if r.at_end():
        return None
    imports: dict[str | None, None] = {}
    top: list[object] = [None, None]  # the two newest stack slots (STACK_GLOBAL's operands)
    # The memo's keys as the loader holds them (MEMOIZE's key is their count): 0..dense-1 and the
    # sparse ones a PUT set beyond; a value only for a name-like short string.
    names: dict[object, str] = {}
    dense, sparse = 0, set[object]()
    value: object = None
    on_stack = 0  # opcodes that put or take something: one INT alone makes a plain integer
    budget = r.budget
    left = budget.ops_left
    try:
        for op, arg, _pos in pickletools.genops(cast(IO[bytes], r)):  # genops calls read, readline
            left -= 1
            if left < 0:
                raise Unreadable(f"more than {budget.max_ops:,} pickle opcodes to walk (the scan's bound)")
            name = op.name
            if name in refused:
                raise Unreadable(f"a {name} opcode, which no such file holds")
            if name in _OFF_STACK:
                continue
            if name in _PUT_OPS or name == "MEMOIZE":
                key = dense + len(sparse) if name == "MEMOIZE" else arg
                if key == dense:
                    dense += 1
                    while sparse and dense in sparse:
                        sparse.discard(dense)
                        dense += 1
                elif not (isinstance(key, int) and 0 <= key < dense):
                    sparse.add(key)
                held = top[-1]
                if isinstance(held, str) and _name_like(held):
                    names[key] = held
                elif names:
                    names.pop(key, None)
                if len(names) + len(sparse) > MAX_MEMO:
                    raise Unreadable(f"a memo of more than {MAX_MEMO:,} names or scattered keys (the scan's bound)")
                continue
            on_stack += 1
            pushed: object = None  # something on the stack that is not a name operand
            imported: str | None = ""
            if name in ("GLOBAL", "INST"):
                imported = str(arg).replace(" ", ".", 1)
            elif name == "STACK_GLOBAL":
                module, attr = top
                imported = f"{module}.{attr}" if isinstance(module, str) and isinstance(attr, str) else None
            elif name in _EXT_OPS:
                imported = None  # copyreg's extension registry: a name set by the loading process
            elif name in _STRING_OPS and isinstance(arg, str) and len(arg) <= NAME_MAX:
                pushed = arg
            elif name in _GET_OPS:
                pushed = names.get(arg)
            elif name in _INT_OPS:
                value = arg
            if imported != "" and imported not in imports:
                check(imported)
                imports[imported] = None
            top = [top[-1], pushed]
    except Unreadable:
        raise
    except (ValueError, EOFError, OverflowError, TypeError) as exc:
        # genops's own words: an unknown opcode, an argument cut short, no STOP before the end.
        raise Unreadable(f"not a whole pickle ({exc})") from None
    finally:
        budget.ops_left = left
    plain = on_stack == 1 and isinstance(value, int) and not isinstance(value, bool)
    return Stream(tuple(imports), value if plain and isinstance(value, int) else None)
