"""Debian packages a real-process test needs (etcd, Slurm), installed on demand: CI starts on a
fresh machine. One apt-get at a time across test processes (a file lock); a fresh machine's
missing package lists fetched once before a second try."""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path
from typing import Sequence

LOCK = Path("/tmp/tsup-test-apt.lock")


def apt_install(packages: Sequence[str], *, timeout_s: float = 900) -> str | None:
    """Install ``packages``; None when it worked, else why not (for the caller's skip message)."""
    names = " ".join(packages)
    if os.geteuid() != 0:
        return f"installing {names} (apt-get install) needs root"
    if not shutil.which("apt-get"):
        return f"there is no apt-get to install {names}"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
        if r.returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], capture_output=True, text=True, timeout=600, env=env)
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    return None if r.returncode == 0 else f"could not install {names}: {r.stderr.strip()[-300:]}"
