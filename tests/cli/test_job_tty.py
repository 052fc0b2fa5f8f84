"""``wrap`` in a real terminal (tmux): the job gets a terminal of its own (``[job] tty = "auto"``),
so its live Rich progress bar shows, while the parsers read the same bytes (a NaN printed through
the bar's console is detected and rolled back); a restart is at most 5 supervisor lines at the
default level, and nothing the job prints steers the terminal through our sentences."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.helpers.apt import apt_install

JOB = """
import os, sys, time
from rich.progress import Progress
first = not os.path.exists("mark")
open("mark", "a").close()
print(f"tty {sys.stdout.isatty()} {sys.stderr.isatty()}", flush=True)
with Progress() as p:
    t = p.add_task("training", total=8)
    for s in range(1, 9):
        nan = first and s == 5
        p.console.print(f"step {s} loss {'nan' if nan else 2.0 - s / 10}")
        p.update(t, advance=1)
        if nan:
            time.sleep(60)  # stopped by the daemon
        time.sleep(0.05)
"""


def _tmux() -> str:
    if shutil.which("tmux") is None:
        why = apt_install(["tmux"])
        if why is not None:
            pytest.skip(why)
    return shutil.which("tmux") or "tmux"


def test_a_rich_bar_shows_through_wrap_on_a_terminal_and_a_restart_is_five_lines(tmp_path: Path) -> None:
    tmux = _tmux()
    (tmp_path / "job.py").write_text(JOB)
    sock = f"tsup-{uuid.uuid4().hex[:8]}"
    cmd = (f"cd {tmp_path} && PYTHONPATH={ROOT} {sys.executable} -m supervisor wrap --state-dir {tmp_path / 'sd'} "
           f"--backoff 0 --grace 2 -- {sys.executable} job.py; echo TSUP-EXIT=$?; sleep 300")
    env = {k: v for k, v in os.environ.items() if k not in ("TMUX", "JOURNAL_STREAM")}
    subprocess.run([tmux, "-L", sock, "new-session", "-d", "-s", "t", "-x", "160", "-y", "60", cmd],
                   check=True, env=env, timeout=30)
    try:
        screen = ""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "TSUP-EXIT=" not in screen:
            screen = subprocess.run([tmux, "-L", sock, "capture-pane", "-p", "-t", "t", "-S", "-"],
                                    capture_output=True, text=True, timeout=30).stdout
            time.sleep(0.2)
    finally:
        subprocess.run([tmux, "-L", sock, "kill-server"], capture_output=True, timeout=30)
    assert "TSUP-EXIT=0" in screen, screen
    lines = screen.splitlines()
    # The job saw terminals, and its bar was drawn live in this terminal, to the end.
    assert any(l.startswith("tty True True") for l in lines), screen
    assert any(re.search(r"training ━+ 100%", l) for l in lines), screen
    # The parsers read the bytes the job wrote into its pty: the NaN was seen in stdout and rolled back.
    det = next(i for i, l in enumerate(lines) if "!! detected nan at step 5 (seen in stdout)" in l)
    assert "evidence: step 5 loss nan" in lines[det + 1], screen
    launched = next(i for i, l in enumerate(lines) if ">> attempt 1 launched" in l)
    ours = [l for l in lines[det:launched + 1] if re.match(r"^\[\d\d:\d\d:\d\d\] |^ {11,}\S", l)]
    assert len(ours) <= 5, "\n".join(ours)
    assert not any("state " in l and " -> " in l for l in lines), screen  # state changes: ledger and debug only
    # job.log holds the same bytes, written through the pty unchanged ("\n", never "\r\n").
    log = (tmp_path / "sd" / "job.log").read_bytes()
    assert b"tty True True\n" in log and b"\r\n" not in log
    plain = re.sub(rb"\x1b\[[0-?]*[ -/]*[@-~]", b"", log)  # Rich colours the numbers it prints
    assert b"step 5 loss nan" in plain and b"step 8 loss 1.2" in plain
