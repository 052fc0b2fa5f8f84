"""A torch.distributed.checkpoint (DCP) save's byte items, found for the pickle scan.

DCP's FileSystemWriter writes each tensor as raw bytes into a ``*.distcp`` file and each other
item (a ``BytesIO``: optimizer param groups, rng and dataloader states, any Python object the job
saves) as ``torch.save``'s bytes at an offset of its own; the reader hands those bytes to
``torch.load(weights_only=False)``, so a byte item can run code when the job resumes. Where each
item lies is in ``.metadata`` (``storage_data``: a ``MetadataIndex`` -> ``_StorageInfo(relative_path,
offset, length)``; ``state_dict_metadata`` says which items are bytes).

Judged by the daemon, not by the load test's child: the scan must judge the save before an
overlapped launch (``verify = "overlap"``), with no load test run and whatever ``load_test`` says,
and its judgement of a byte item must be the same allowlist walk as every other pickle
(:mod:`.picklescan`). Located by a child: ``.metadata`` is unpickled into plain stand-ins for
DCP's classes by ``_dcpitems_script.py`` (stdlib only, the daemon's own interpreter, an
address-space limit, a deadline), which prints each byte item's place; the daemon reads that to a
bounded head and scans each item's bytes itself. Why a child and not the daemon: the stand-ins of
a large FSDP save cost hundreds of MiB (about 2.4-3.5 KiB an entry, held until the load ends), so
in the daemon the budget had to stop at 55,000 entries and a healthy larger save was not ready;
the child's memory is its own and gone when it exits, and a save the walk passed (up to about
370,000-590,000 entries, :data:`METADATA_OPCODES`) is located in seconds. Only once the pickle
scan's opcode walk has passed ``.metadata`` (only DCP's data classes, sizes and dtypes named,
within its budget); the child's ``find_class`` gives nothing but holders for those names.
Tensor items are raw bytes, never unpickled: skipped.

Bounds: ``.metadata`` at most ``MAX_METADATA_BYTES`` walked on ``METADATA_OPCODES`` (its own
budget); at most ``MAX_ITEMS`` storage entries and ``MAX_BYTE_ITEMS`` byte items of
``MAX_ITEM_BYTES`` in all (their pickles also spend the scan's :class:`~.picklestream.Budget`);
the child within ``CHILD_AS_BYTES`` of address space and ``CHILD_TIMEOUT_S``, its output within
``CHILD_OUTPUT_BYTES``; an item must lie inside its file, a regular file of the folder (opened
without blocking, a FIFO never read), stored plain (a transform such as compression is not read).
Past any of them, or anything that does not parse: a :class:`~.pickledeny.Refusal` (not called
checked), never a pass.
"""
from __future__ import annotations

import io
import json
import os
import stat
import sys
from pathlib import Path
from typing import IO, Callable

from .. import childio
from ..errors import SupervisorError
from ._dcpitems_script import REFUSED_EXIT, dcp_data
from .pickledeny import Refusal

DCP_METADATA = ".metadata"
# .metadata's own walk (its opcodes are not the checkpoint's budget), measured on real saves: 108
# opcodes and 250 bytes an entry for unsharded tensors (40,000 entries: 4.3 million opcodes, 10 MB),
# 68 opcodes and 140 bytes an entry for an FSDP save (800 parameters x 3 states x 64 ranks =
# 153,600 entries: 10.5 million opcodes, 21 MB, walked in about 9 s on the loaded 2-core machine).
# 40 million: a save of 370,000-590,000 entries, 35 s at most. 128 MiB covers those; a file past
# WHOLE_METADATA_BYTES is walked from the file (constant memory), not held whole.
MAX_METADATA_BYTES = 128 << 20
METADATA_OPCODES = 40_000_000
WHOLE_METADATA_BYTES = 32 << 20
MAX_ITEMS = 1_000_000
MAX_BYTE_ITEMS = 10_000
MAX_ITEM_BYTES = 64 << 20  # all byte items together: real ones are a few KiB each
# The child's stand-ins: 354 MiB traced for the 153,600-entry save, so 4 GiB of address space
# holds the largest save the walk passes; its output is at most MAX_BYTE_ITEMS lines.
CHILD_AS_BYTES = 4 << 30
CHILD_TIMEOUT_S = 180.0
CHILD_OUTPUT_BYTES = 16 << 20
# No set in it (DCP's classes hold none): a set is 200 bytes built from one byte.
SET_OPS = frozenset({"EMPTY_SET", "FROZENSET", "ADDITEMS"})
_SCRIPT = Path(__file__).with_name("_dcpitems_script.py")


class _Unreadable(SupervisorError):
    """The byte items cannot be located (the message says why): the save is refused."""


class _NotNow(SupervisorError):
    """The byte items cannot be located now, for a reason that may pass (a deadline on a loaded
    machine, a file that cannot be opened now): refused, and not remembered (:mod:`.scancache`)."""


def _open_regular(path: Path) -> IO[bytes]:
    """Opened without blocking (a FIFO in a file's place would hold the scan for good), read only
    when a regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _Unreadable(f"{path.name} is not a regular file")
    return os.fdopen(fd, "rb")


def _identity(path: Path) -> list[int]:
    st = os.stat(path)
    return [st.st_ino, st.st_size, st.st_mtime_ns]


def _byte_items(folder: Path) -> list[tuple[str, str, int, int]]:
    """(fqn, relative_path, offset, length) of every byte item, in the metadata's order, as the
    child read them from the ``.metadata`` the walk passed (the same version, or refused)."""
    path = folder / DCP_METADATA
    before = _identity(path)
    if before[1] > MAX_METADATA_BYTES:
        raise _Unreadable(f"{before[1]:,} bytes, past the {MAX_METADATA_BYTES >> 20} MiB the scan reads")
    argv = [sys.executable, "-I", "-S", str(_SCRIPT), str(path), str(MAX_ITEMS), str(MAX_BYTE_ITEMS),
            str(CHILD_AS_BYTES)]
    res = childio.run(argv, timeout_s=CHILD_TIMEOUT_S, keep=CHILD_OUTPUT_BYTES, stdout_head=True)
    if res.timed_out:
        raise _NotNow(f"its reader did not finish within {CHILD_TIMEOUT_S:g} s")
    lines = res.stdout.decode(errors="replace").splitlines()
    try:
        last = json.loads(lines[-1]) if lines else None
    except ValueError:
        last = None
    if res.returncode == REFUSED_EXIT and isinstance(last, dict) and isinstance(last.get("refused"), str):
        raise _Unreadable(last["refused"])
    if res.dropped:
        raise _Unreadable(f"its reader printed more than the {CHILD_OUTPUT_BYTES:,} bytes read of it")
    if res.returncode != 0 or not isinstance(last, dict) or "done" not in last:
        how = f"exit status {res.returncode}" if (res.returncode or 0) >= 0 else f"signal {-(res.returncode or 0)}"
        raise _Unreadable(f"its reader failed ({how}: {res.stderr_tail() or 'no output'})")
    if last.get("identity") != before or _identity(path) != before:
        raise _NotNow("it changed while it was read")
    items: list[tuple[str, str, int, int]] = []
    for line in lines[:-1]:
        fqn, rel, offset, length = json.loads(line)["item"]
        items.append((str(fqn), str(rel), int(offset), int(length)))
    if len(items) != last["done"]:
        raise _Unreadable("its reader's output is not whole")
    return items


def scan_byte_items(folder: Path, scan_item: Callable[[IO[bytes], str], str | None]) -> Refusal | None:
    """Each byte item of the DCP save in ``folder`` through ``scan_item`` (the pickle scan of one
    stream: the refusal's words, or None); the first refusal, or one for what cannot be read.
    ``scan_item`` spends the checkpoint's :class:`~.picklestream.Budget` as any pickle does."""
    try:
        items = _byte_items(folder)
    except _Unreadable as exc:
        return Refusal(DCP_METADATA, f"{DCP_METADATA}: {exc}, so its byte items are not called checked")
    except _NotNow as exc:
        return Refusal(DCP_METADATA, f"{DCP_METADATA}: {exc}, so its byte items are not called checked yet",
                       transient=True)
    except OSError as exc:
        return Refusal(DCP_METADATA, f"{DCP_METADATA}: cannot be read now ({exc.strerror or exc})", transient=True)
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
    except _Unreadable as exc:
        return Refusal(DCP_METADATA, f"{DCP_METADATA}: a file it names cannot be read ({exc}), so it is not called checked")
    except OSError as exc:
        return Refusal(DCP_METADATA, f"{DCP_METADATA}: a file it names cannot be read now "
                                     f"({exc.strerror or exc}), so it is not called checked", transient=True)
    finally:
        for f in files.values():
            f.close()
    return None


__all__ = ["DCP_METADATA", "MAX_BYTE_ITEMS", "MAX_ITEMS", "MAX_ITEM_BYTES", "MAX_METADATA_BYTES", "METADATA_OPCODES",
           "SET_OPS", "WHOLE_METADATA_BYTES", "dcp_data", "scan_byte_items"]
