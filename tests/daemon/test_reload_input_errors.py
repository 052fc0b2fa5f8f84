"""SIGHUP with a bad config file through a real daemon (issue 24 build 6): invalid UTF-8, TOML
nested 5,000 deep and a FIFO at the config path are each a `reload_rejected` event naming the
problem; the running config is kept, the main loop is never blocked (the FIFO has no writer) and
no traceback is logged."""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from tests.util import wait_for

SLEEPER = [sys.executable, "-c", "import sys,time; open(sys.argv[1],'w').write('x'); time.sleep(600)"]


def fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def test_sighup_with_bad_utf8_deep_toml_or_a_fifo_is_rejected_and_the_daemon_goes_on(daemons, tmp_path: Path) -> None:
    sd, ready, cfgp = tmp_path / "sd", tmp_path / "ready", tmp_path / "c.toml"
    cmd = ", ".join(f'"{a}"' for a in SLEEPER + [str(ready)])
    cfgp.write_text(f'[job]\ncommand = [{cmd}]\n[state]\ndir = "{sd}"\n')
    d = daemons(["run", "--config", str(cfgp)])
    wait_for(ready.exists, 30, what="job ready")
    bad = [("not valid UTF-8", lambda: cfgp.write_bytes(b'[job]\nname = "\xff"\n')),
           ("nested too deeply", lambda: cfgp.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")),
           ("not a regular file", lambda: fifo(cfgp))]
    for n, (expect, write) in enumerate(bad, 1):
        write()
        d.signal(signal.SIGHUP)
        wait_for(lambda: d.stderr().count("reload_rejected") >= n and expect in d.stderr(), 20,
                 what=f"reload_rejected: {expect}")
    d.signal(signal.SIGTERM)
    assert d.wait(30) == 143
    assert "Traceback" not in d.stderr() and "internal error" not in d.stderr().lower()
