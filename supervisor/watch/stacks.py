"""Python stack dumps of a hung job with py-spy, before it is killed.

``py-spy dump --pid P`` attaches read-only (ptrace) and prints every thread's Python stack; with
``native`` it adds C/C++ frames (slower). py-spy is a dependency of the daemon's install (the
busy-or-stuck look, :mod:`supervisor.watch.look`, samples stacks with it too); where it is
missing anyway (an install without dependencies) the dump says so plainly and the hang is still
handled. A process the blocking dump cannot stop (a SIGSTOPped one: "Failed to suspend process")
is read again with ``--nonblocking``. Each process gets a bounded time, so a stuck ptrace never
delays the stop for long.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path
from typing import Iterable

import psutil
import structlog

from .. import childio

log = structlog.get_logger("supervisor.watch")


#: The bytes kept of one process's dump (its head: the threads in the order py-spy prints them).
DUMP_BYTES = 4 << 20


def _dump(cmd: list[str], timeout_s: float) -> childio.Drained:
    return childio.run(cmd, timeout_s=timeout_s, keep=DUMP_BYTES, stdout_head=True)


def find_py_spy() -> str | None:
    """py-spy on PATH, or beside the running interpreter (a venv that is not activated)."""
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


def group_pids(pgid: int) -> list[int]:
    """Every live process in process group ``pgid`` (the job runs in its own session)."""
    out: list[int] = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid:
                out.append(p.pid)
        except (ProcessLookupError, PermissionError, OSError):
            continue
    return sorted(out)


def dump_stacks(pids: Iterable[int], out_dir: Path, *, native: bool = False, timeout_s: float = 10.0,
                py_spy: str | None = None, label: str = "hang") -> Path | None:
    """Write ``out_dir/stacks-<label>-<time>.txt`` with the py-spy dump of each pid.

    Returns the file, or None when py-spy is not installed (logged as ``stacks_unavailable``).
    A process that exits or cannot be attached is recorded in the file with py-spy's error.
    """
    pids = list(pids)
    exe = py_spy or find_py_spy()
    if exe is None:
        log.warning("stacks_unavailable", reason="py-spy is not installed", pids=pids,
                    next="reinstall transformer-supervisor with its dependencies (py-spy) to get stack dumps of hung jobs")
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"stacks-{label}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.txt"
    started = time.monotonic()
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"# py-spy dump of {len(pids)} process(es): {' '.join(map(str, pids))}\n")
        for pid in pids:
            cmd = [exe, "dump", "--pid", str(pid)] + (["--native"] if native else [])
            f.write(f"\n===== pid {pid}: {' '.join(cmd)}\n")
            f.flush()
            try:
                res = _dump(cmd, timeout_s)
                if res.returncode != 0 and "suspend" in (err := res.stderr_tail(2000)):  # stopped: no ptrace
                    f.write(f"# the blocking dump failed ({(err.splitlines() or [''])[0]}); read with --nonblocking\n")
                    res = _dump(cmd + ["--nonblocking"], timeout_s)
                if res.timed_out:
                    f.write(f"# py-spy did not finish within {timeout_s:g} s; skipped\n")
                    continue
                f.write(res.stdout.decode(errors="replace"))
                if res.dropped:
                    f.write(f"\n# ... {res.dropped} more bytes of this dump not kept (the first {DUMP_BYTES} are)\n")
                if res.returncode != 0:
                    f.write(f"# py-spy exited {res.returncode}: {res.stderr_tail(2000)}\n")
            except OSError as exc:
                f.write(f"# py-spy could not run: {exc}\n")
    log.info("stacks_dumped", path=str(path), pids=pids, seconds=round(time.monotonic() - started, 2),
             next="the hung job is stopped now")
    return path
