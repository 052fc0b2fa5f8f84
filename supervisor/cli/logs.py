"""``transformer-supervisor logs [-f] [-n N] [--stderr]``: the job's output from its log file.

The output keeper writes job.log (both streams, byte-exact as read) and job.stderr.log (the
job's stderr alone) beside it (:mod:`supervisor.job.keeper`); this verb reads them, so it works
while the daemon runs, after it exited, and when it was killed. Which file: ``[job] log_file``
of the config given, or of the run's config recorded in the ledger (a relative one under the
job's workdir), else ``<state dir>/job.log``.

The last lines come from the rotated job.log.1, .2 ... too when job.log holds fewer (the keeper
rotates it past ``[job] log_max_bytes``). ``-n N`` reads a bounded part however large the log
(:func:`copy_last_lines`: a line's last 64 KiB, N x 256 KiB scanned); ``-n 0`` all of it. ``-f`` follows the file as ``tail -F`` does (a file
renamed away, by the keeper or logrotate, is read to its end, then the new one from its start;
one truncated in place is read again from its start) and
ends by itself once the daemon has exited and the file stopped growing. Whether the daemon runs
is read from its lock file (``daemon.lock`` holds its pid): taking the lock to test it could
refuse a daemon starting at that moment.

Every file is read only when it is a regular file, never through a link and never a FIFO
(:mod:`supervisor.regularfile`); anything else is said and exits 1. The job's lines are printed
byte for byte, escape sequences included, on a terminal too, as ``tail`` does: they are the
job's own output (its colours, its progress bars) and ``logs > file`` must equal the file; what
this verb says itself (paths, errors) has its control characters escaped. For a job you do not
trust: ``logs | cat -v``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import BinaryIO, Callable

from ..job.keeper import rotated_logs, stderr_log_path
from ..regularfile import NotARegularFile, open_regular_binary, read_regular_text
from ..textescape import escaped

BLOCK = 1 << 16
#: the most of one line ``logs -n``/``status`` show (its last bytes), and what a line costs the
#: backward scan: ``n`` lines read at most ``n`` x 4 x this (a bar of 3 GB without a newline included)
MAX_LINE_BYTES = 1 << 16
POLL_S = 0.2  # how often -f looks for new bytes: a human reading a log never sees 0.2 s


def job_log_path(state_dir: Path, config: str | None, problems: list[str] | None = None) -> Path:
    """The job log the daemon for this state dir writes. A ledger that cannot be read (a
    garbled page) leaves the state dir's own job.log, and its error is added to ``problems``."""
    if config:
        from .clientconfig import lenient_config

        cfg = lenient_config(config, quiet=True)
        return cfg.log_file() if cfg.job.log_file else state_dir / "job.log"
    from ..ledger.store import LedgerError

    try:
        return _recorded_log_path(state_dir) or state_dir / "job.log"
    except LedgerError as e:
        if problems is not None:
            problems.append(e.message)
        return state_dir / "job.log"


def _recorded_log_path(state_dir: Path) -> Path | None:
    """``[job] log_file`` of the newest run in the ledger; None when it names none (or no ledger
    at all). LedgerError when the ledger is there but cannot be read."""
    from ..ledger.store import Ledger

    try:
        led = Ledger(state_dir, readonly=True)
    except FileNotFoundError:
        return None
    try:
        run_id = led.latest_run_id()
        table = led.run_config(run_id) if run_id else {}
        job = table.get("job") or {}
        log_file = job.get("log_file")
        if not log_file:
            return None
        p = Path(log_file).expanduser()
        if p.is_absolute():
            return p
        workdir = job.get("workdir")
        if workdir and Path(workdir).expanduser().is_absolute():
            return Path(workdir).expanduser() / p
        attempts = led.history(run_id).get("attempts") or []
        cwd = attempts[-1].get("cwd") if attempts else None  # where the daemon ran the job
        return Path(cwd) / p if cwd else p
    finally:
        led.close()


def daemon_alive(state_dir: Path) -> bool:
    """A daemon holds this state dir: the pid in its lock file lives, started before it wrote it
    (a pid reused since by another process started later)."""
    import psutil

    lock = state_dir / "daemon.lock"
    try:
        pid = int(read_regular_text(lock, "a lock file").strip() or 0)  # a FIFO there must not hang -f
        written = lock.stat().st_mtime
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and proc.create_time() <= written + 1.0
    except (OSError, ValueError, psutil.Error):
        return False


def last_lines_offset(f: BinaryIO, end: int, n: int) -> int:
    """Where the last ``n`` lines of ``f[:end]`` start (0 = all); a last line without its
    newline counts as a line."""
    return lines_from_end(f, end, n)[0]


def lines_from_end(f: BinaryIO, end: int, n: int) -> tuple[int, int]:
    """Where the last ``n`` lines of ``f[:end]`` start (0 = all), and how many lines that is
    (fewer than ``n`` when the file holds fewer). Read backwards a block at a time, at most
    ``n`` x 4 x :data:`MAX_LINE_BYTES` (:func:`scan_budget`): past it (a tqdm bar off a terminal, one
    "line" of gigabytes without a newline) the start returned is where the budget ran out, in
    the middle of a line, which :func:`copy_lines_capped` shows as cut."""
    if n <= 0 or end == 0:
        return 0, 0
    pos, wanted = end, n
    f.seek(end - 1)
    final_newline = f.read(1) == b"\n"
    if final_newline:
        wanted += 1  # the file's final newline ends the last line; it does not start one
    stop = max(0, end - scan_budget(n))
    while pos > stop:
        size = min(BLOCK, pos - stop)
        pos -= size
        f.seek(pos)
        block = f.read(size)
        count = block.count(b"\n")
        if count >= wanted:
            cut = len(block)
            for _ in range(wanted):
                cut = block.rindex(b"\n", 0, cut)
            return pos + cut + 1, n
        wanted -= count
    return pos, n - wanted + 1  # all of it (or all the budget allowed): its newlines, or one more


def scan_budget(n: int) -> int:
    """The most bytes read backwards for the last ``n`` lines: room for each to be a few times
    :data:`MAX_LINE_BYTES` long (cut when shown), and no more."""
    return max(1, n) * 4 * MAX_LINE_BYTES


def copy_last_lines(path: Path, f: BinaryIO, end: int, n: int, out: BinaryIO) -> None:
    """The last ``n`` lines of the log (0: all of it, byte for byte), the older of them from the
    rotated job.log.1, .2 ... when job.log holds fewer (it was just rotated). With ``n`` > 0, each
    line is shown with its last :data:`MAX_LINE_BYTES` at most and the bytes read are bounded
    (:func:`lines_from_end`): a log of one unterminated 3 GB line costs 64 KiB a line, not 3 GB."""
    start, found = lines_from_end(f, end, n)
    older: list[tuple[BinaryIO, int, int]] = []
    if start == 0 and (n <= 0 or found < n):
        names = rotated_logs(str(path))
        here = os.fstat(f.fileno())
        for i, name in enumerate(names):  # f itself rotated since it was opened: older ones are past it
            try:
                st = os.stat(name)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) == (here.st_dev, here.st_ino):
                names = names[i + 1:]
                break
        for name in names:
            try:
                g = open_regular_binary(name, "a job log")
            except OSError:
                break
            g_end = os.fstat(g.fileno()).st_size
            g_start, g_found = lines_from_end(g, g_end, n - found) if n > 0 else (0, 0)
            older.append((g, g_start, g_end))
            found += g_found
            if n > 0 and (g_start > 0 or found >= n):
                break
    for rotated, r_start, r_end in reversed(older):  # oldest first, as written
        with rotated:
            _copy(rotated, r_start, r_end, out, n)
    _copy(f, start, end, out, n)


def _copy(f: BinaryIO, start: int, end: int, out: BinaryIO, n: int) -> None:
    if n <= 0:
        copy_range(f, start, end, out)
    else:
        copy_lines_capped(f, start, end, out)


def copy_lines_capped(f: BinaryIO, start: int, end: int, out: BinaryIO, max_line: int | None = None) -> None:
    """``f[start:end]`` line by line, each line cut to its last ``max_line`` bytes (a terminal
    shows a progress bar's last state: its end), said in place (``…(N bytes cut) ``). A ``start``
    in the middle of a line (the scan's budget ran out) cuts that line too (``…(cut) ``)."""
    limit = MAX_LINE_BYTES if max_line is None else max_line
    mid_line = start > 0
    if mid_line:
        f.seek(start - 1)
        mid_line = f.read(1) != b"\n"
    held = bytearray()
    dropped = -1 if mid_line else 0  # bytes cut off the current line's front; -1: unknown

    def flush() -> None:
        if dropped:
            out.write(b"\xe2\x80\xa6(cut) " if dropped < 0 else f"\u2026({dropped} bytes cut) ".encode())
        out.write(held)

    f.seek(start)
    left = end - start
    while left > 0:
        data = f.read(min(BLOCK, left))
        if not data:
            break
        left -= len(data)
        pos = 0
        while pos < len(data):
            nl = data.find(b"\n", pos)
            upto = len(data) if nl < 0 else nl + 1
            held += data[pos:upto]
            body = len(held) - (1 if nl >= 0 else 0)
            if body > limit:
                extra = body - limit
                del held[:extra]
                dropped = dropped + extra if dropped >= 0 else dropped
            pos = upto
            if nl >= 0:
                flush()
                held.clear()
                dropped = 0
    if held:
        flush()
    out.flush()


def terminal_lines(data: bytes, n: int) -> list[str]:
    """The last ``n`` lines of ``data`` as a terminal shows them: a carriage return (a progress
    bar redrawn in place) ends what is seen of a line, so a line shows its last segment."""
    text = data.decode("utf-8", "replace")
    lines = text.split("\n")
    if lines and not lines[-1]:
        lines.pop()  # the final newline ends the last line, it starts none
    shown = [line.rstrip("\r").rsplit("\r", 1)[-1] for line in lines[-n:]] if n > 0 else []
    return shown


def copy_range(f: BinaryIO, start: int, end: int, out: BinaryIO) -> None:
    f.seek(start)
    left = end - start
    while left > 0:
        data = f.read(min(BLOCK, left))
        if not data:
            break
        out.write(data)
        left -= len(data)
    out.flush()


def follow(path: Path, f: BinaryIO, pos: int, out: BinaryIO, alive: Callable[[], bool],
           poll_s: float = POLL_S) -> None:
    """Print what is appended to ``path`` from ``pos`` on, across rotation and truncation,
    until ``alive()`` is false and a look found nothing new."""
    quiet_after_exit = False
    while True:
        f.seek(pos)
        data = f.read(BLOCK)
        if data:
            out.write(data)
            out.flush()
            pos += len(data)
            quiet_after_exit = False
            continue
        try:
            st = os.stat(path)
        except FileNotFoundError:
            st = None  # renamed away, its successor not created yet: keep the one we have
        here = os.fstat(f.fileno())
        if st is not None and (st.st_dev, st.st_ino) != (here.st_dev, here.st_ino):
            # What the writer added before it moved on, then the file it wrote next from its start:
            # the rotated one just newer (several rotations since the last look), else the new one.
            copy_range(f, pos, here.st_size, out)
            f.close()
            f = open_regular_binary(_successor(path, (here.st_dev, here.st_ino)), "a job log")
            pos = 0
            continue
        if here.st_size < pos:
            pos = 0  # truncated in place (copytruncate): what is there now is new
            continue
        if not alive():
            if quiet_after_exit:  # the daemon is gone and the file stopped growing
                f.close()
                return
            quiet_after_exit = True
        time.sleep(poll_s)


def _successor(path: Path, ident: tuple[int, int]) -> str:
    """The file written after the one of ``ident``: the rotated log just newer than it
    (job.log.3 -> job.log.2), or ``path`` itself (after job.log.1, or a name it does not know)."""
    names = rotated_logs(str(path))
    for i, name in enumerate(names):
        try:
            st = os.stat(name)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == ident:
            return names[i - 1] if i > 0 else str(path)
    return str(path)


def cmd_logs(args: argparse.Namespace, state_dir: Path) -> int:
    problems: list[str] = []
    path = job_log_path(state_dir, getattr(args, "config", None), problems)
    # Said with every control byte escaped: the path may come from the ledger (the run's log_file).
    for problem in problems:  # the log is still shown: it does not depend on the ledger
        print(f"transformer-supervisor: {escaped(problem)}; showing {escaped(path)}, the state dir's job log (a "
              "[job] log_file the run set elsewhere is not known without the ledger: pass --config PATH)",
              file=sys.stderr)
    if args.stderr:
        path = Path(stderr_log_path(str(path)))
    what = "stderr log" if args.stderr else "job log"
    alive = lambda: daemon_alive(state_dir)  # noqa: E731
    try:
        # Only a regular file, never through a link (as the keeper writes it: O_NOFOLLOW), a FIFO
        # never opened for a read that would wait forever. One swapped in later, while -f reads,
        # is refused the same way (NotARegularFile, said by main.cmd_logs).
        f = open_regular_binary(path, f"a {what}")
    except FileNotFoundError:
        if not (args.follow and alive()):
            print(f"transformer-supervisor: no {what} at {escaped(path)} (the job has not started, or the run is "
                  f"elsewhere: --state-dir DIR or --config PATH)", file=sys.stderr)
            return 1
        print(f"transformer-supervisor: waiting for {escaped(path)} (the daemon runs; the job has not started "
              "yet)", file=sys.stderr)
        while not os.path.lexists(path):
            if not alive():
                print(f"transformer-supervisor: the daemon exited and {escaped(path)} never appeared",
                      file=sys.stderr)
                return 1
            time.sleep(POLL_S)
        f = open_regular_binary(path, f"a {what}")
    except NotARegularFile as e:
        print(f"transformer-supervisor: {escaped(e)}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"transformer-supervisor: cannot read {escaped(path)}: {escaped(e)}", file=sys.stderr)
        return 1
    out = sys.stdout.buffer
    with f:
        end = os.fstat(f.fileno()).st_size
        copy_last_lines(path, f, end, args.lines, out)
        if args.follow:
            follow(path, f, end, out, alive)
    return 0
