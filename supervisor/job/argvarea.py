"""The standby's command line made the job's: after the hand-over, ``/proc/PID/cmdline`` (what
``ps -o args``, ``pgrep -f``, ``top``, py-spy, a monitoring agent and a scheduler's epilog read)
shows the argv the attempt was started with, not ``standby.py SOCK_FD CONFIG``.

How: the kernel shows a process's cmdline from the memory its argv strings were copied to at exec
(``arg_start`` .. ``arg_end``, fields 48 and 49 of /proc/self/stat), and a process may write over
that memory (setproctitle does). We write through /proc/self/mem: no ctypes and no package, since
the standby runs in the job's Python with the standard library only and whatever it imports is
imported into the job. Nothing else reads that memory once the interpreter has started (sys.argv
and sys.orig_argv are copies); argv[0] is written back unchanged (the job's interpreter is the
standby's), so glibc's ``program_invocation_name``, which points into it, reads the same.

The area's size is fixed at exec. The daemon gives the standby room (a last argument of spaces,
:func:`padding`); the argv, NUL-separated, fills the area's start and NULs the rest: the kernel
shows the whole area, and procps (ps, pgrep), py-spy and psutil-style readers drop trailing NULs.
An argv that does not fit is shown joined by spaces and cut, still ended by a NUL. The
environment area that follows is never touched: libc's ``environ`` may still point into it.

Loaded by path (as codeseen.py), standard library only.
"""

from __future__ import annotations

import os

ROOM_MIN = 4096  # bytes kept free beyond the job's argv: the next attempt may add resume flags
ROOM_MAX = 100_000  # one argument stays below the kernel's MAX_ARG_STRLEN (32 pages)


def encoded(argv: list[str]) -> bytes:
    """The argv as the kernel lays it out: each argument followed by a NUL."""
    return b"".join(os.fsencode(a) + b"\0" for a in argv)


def padding(job_argv: list[str], own_argv: list[str]) -> str:
    """The spaces to append (as one more argument) to ``own_argv`` so that its area holds
    ``job_argv`` with room to spare; "" when it already does."""
    need = len(encoded(job_argv))
    want = need + max(need, ROOM_MIN)
    have = len(encoded(own_argv)) + 1  # the padding argument's own NUL
    return " " * min(ROOM_MAX, max(0, want - have))


def area() -> tuple[int, int]:
    """This process's argv area (start, end) from /proc/self/stat (Linux 3.5+)."""
    with open("/proc/self/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rindex(b")") + 2:].split()  # the command name may hold spaces: after its ')'
    return int(fields[45]), int(fields[46])  # fields[0] is field 3 (state)


def layout(argv: list[str], size: int) -> bytes:
    """``size`` bytes for the area: the argv NUL-separated, or space-joined and cut; NULs after."""
    exact = encoded(argv)
    if len(exact) <= size:
        return exact.ljust(size, b"\0")
    return b" ".join(os.fsencode(a) for a in argv)[:size - 1].ljust(size, b"\0")


def show(argv: list[str]) -> str | None:
    """Write ``argv`` over this process's argv area; None when done, else why not (the job runs
    anyway, its command line the standby's)."""
    try:
        start, end = area()
        if not 0 < start < end:
            return "the kernel gives no argv area"
        fd = os.open("/proc/self/mem", os.O_RDWR | os.O_CLOEXEC)
        try:
            os.pwrite(fd, layout(argv, end - start), start)
        finally:
            os.close(fd)
    except (OSError, ValueError, IndexError) as e:
        return f"cannot write its argv area ({e})"
    return None
