"""A terminal for the job when the supervisor itself runs on one (``[job] tty``).

Why: a job whose stdout is a pipe hides its live display. Rich (Lightning's default progress bar)
and tqdm test ``isatty()``: into a pipe Rich draws nothing per step and tqdm stops redrawing in
place, so a user who runs ``wrap`` in a terminal loses the bar they would see without us. A
pseudo-terminal per stream gives the job a terminal while the output keeper still reads every
byte (job.log, the console pass-through and the parsers read the same bytes as before; the
parsers already take ``\\r`` redraws and ANSI escapes apart).

Each stream gets its own pty, so stdout and stderr stay apart (``logs --stderr``, the console
line shared with our event lines). The slave side passes bytes unchanged (no ``OPOST``: a
``\\n`` stays ``\\n``, never ``\\r\\n``), and takes the window size of the supervisor's own terminal
so a bar is drawn for the width the user sees. The job is started in a session of its own and
``openpty`` opens the slave with ``O_NOCTTY``: the pty is never its controlling terminal, so no
SIGHUP or job-control signal reaches it through the pty. A master read after the job's last
slave is closed gives ``EIO``: the keeper reads that as the end of the stream, as a pipe's EOF.

Standard library only (``os.openpty``, ``termios``); written here because it is a dozen lines.
"""

from __future__ import annotations

import fcntl
import os
import struct
import termios

MODES = ("auto", "always", "never")


def wants_tty(mode: str, fd: int) -> bool:
    """Whether the job's stream ``fd`` (1 or 2) gets a pty: ``always``, or ``auto`` where the
    supervisor's own ``fd`` is a terminal (a user's shell; never under systemd or in a pipe)."""
    if mode == "always":
        return True
    if mode != "auto":
        return False
    try:
        return os.isatty(fd)
    except OSError:
        return False


def window_size(fd: int) -> tuple[int, int] | None:
    """(rows, columns) of the terminal on ``fd``, or None."""
    try:
        rows, cols, _, _ = struct.unpack("HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
    except OSError:
        return None
    return (rows, cols) if rows and cols else None


def open_pty(like_fd: int) -> tuple[int, int]:
    """(master, slave) of a new pty whose output passes unchanged and whose window is the size
    of the terminal on ``like_fd`` (80x24 when there is none)."""
    master, slave = os.openpty()
    try:
        attrs = termios.tcgetattr(slave)
        attrs[1] &= ~termios.OPOST  # oflag: no "\n" -> "\r\n", no tab expansion: bytes as written
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
        rows, cols = window_size(like_fd) or (24, 80)
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    except BaseException:
        os.close(master)
        os.close(slave)
        raise
    return master, slave


__all__ = ["MODES", "open_pty", "wants_tty", "window_size"]
