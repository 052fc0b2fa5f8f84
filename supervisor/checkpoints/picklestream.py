"""One pickle stream, walked statically and within a bound: which globals unpickling it would
import and, where the whole stream is one integer, its value (a legacy torch file's magic number,
a count of the legacy tar format). Nothing is imported or executed: :func:`pickletools.genops`
yields opcodes and their arguments, for every protocol (0-5; protocol 0 and 1 have no PROTO
opcode, so the first byte says nothing about whether a file is a pickle).

Fail-closed: a stream that does not run to its STOP opcode, an opcode genops does not know, a
name whose operands cannot be told statically, or a stream past the bound raises
:class:`Unreadable`, and what cannot be read is never called checked.

The bound, per checkpoint (one :class:`Budget` for all its files and streams): at most
``MAX_PICKLE_BYTES`` read through the walk (an argument that claims more, such as a BINBYTES8 of a
terabyte, is refused before any memory is taken for it) and ``MAX_OPCODES`` opcodes (0.6-1.5 µs
each: at most about 3 s of one core on a loaded 2-core machine). Past either, the checkpoint is
not called checked: it is load-tested before the launch instead of beside it. The walk keeps
two stack slots and the memo's keys, with a value only for short strings (what a STACK_GLOBAL
may fetch), at most ``MAX_MEMO`` of them (about 40 MiB); nesting depth costs nothing:
5,000 nested lists are 10,000 opcodes like any others.
"""
from __future__ import annotations

import pickletools
from dataclasses import dataclass
from typing import IO, Callable, cast

MAX_PICKLE_BYTES = 64 << 20
MAX_OPCODES = 2_000_000
MAX_MEMO = 500_000
NAME_MAX = 200  # longer strings are never module or attribute names we allow: not kept in the memo

_STRING_OPS = frozenset({"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "STRING", "BINSTRING",
                         "SHORT_BINSTRING"})
_INT_OPS = frozenset({"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4"})
_PUT_OPS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
_GET_OPS = frozenset({"GET", "BINGET", "LONG_BINGET"})
_EXT_OPS = frozenset({"EXT1", "EXT2", "EXT4"})
_OFF_STACK = frozenset({"PROTO", "FRAME", "STOP"})  # framing: a frame may fall between a name's two parts


class Unreadable(Exception):
    """Why a stream cannot be checked statically (the message names what was met)."""


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


@dataclass(frozen=True)
class Stream:
    """What one pickle stream holds for the scan."""

    imports: tuple[str | None, ...]  # each distinct module.name imported; None: computed at load time
    value: int | None  # the stream's value when it is one plain integer, else None


def read_stream(r: BoundedReader, check: Callable[[str | None], None]) -> Stream | None:
    """The next pickle stream of ``r``; None at a clean end of the data. Raises Unreadable, and
    whatever ``check`` raises: it is called on each import as the walk meets it (a loader runs a
    REDUCE before it reads on, so what a stream imports before it breaks off counts)."""
    if r.at_end():
        return None
    imports: dict[str | None, None] = {}
    top: list[object] = [None, None]  # the two newest stack slots (STACK_GLOBAL's operands)
    memo: dict[object, str | None] = {}  # memo index -> short string, or None for anything else
    value: object = None
    on_stack = 0  # opcodes that put or take something: one INT alone makes a plain integer
    try:
        for op, arg, _pos in pickletools.genops(cast(IO[bytes], r)):  # genops calls read, readline
            r.budget.spend_op()
            name = op.name
            if name in _OFF_STACK:
                continue
            if name in _PUT_OPS or name == "MEMOIZE":
                # Every key is kept (MEMOIZE's key is the memo's size), a value only when it is
                # a short string: a later GET of anything else cannot name an import.
                memo[len(memo) if name == "MEMOIZE" else arg] = top[-1] if isinstance(top[-1], str) else None
                if len(memo) > MAX_MEMO:
                    raise Unreadable(f"a memo of more than {MAX_MEMO:,} entries (the scan's bound)")
                continue
            on_stack += 1
            pushed: object = object()  # something on the stack that is not a name operand
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
                pushed = memo.get(arg) or pushed
            elif name in _INT_OPS:
                value = arg
            if imported != "":
                if imported not in imports:
                    check(imported)
                    imports[imported] = None
            top = [top[-1], pushed]
    except Unreadable:
        raise
    except (ValueError, EOFError, OverflowError, TypeError) as exc:
        # genops's own words: an unknown opcode, an argument cut short, no STOP before the end.
        raise Unreadable(f"not a whole pickle ({exc})") from None
    plain = on_stack == 1 and isinstance(value, int) and not isinstance(value, bool)
    return Stream(tuple(imports), value if plain and isinstance(value, int) else None)
