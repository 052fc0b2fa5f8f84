"""Issue 24, through the real daemon and the real CLI: clients of the daemon's own uid that
trickle bytes into the control socket (and reconnect when dropped) cannot hold off status or stop."""
from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path

from tests.util import wait_for

PY = sys.executable
ROOT = Path(__file__).resolve().parents[2]
SLEEPER = [PY, "-c", "import sys,time; open(sys.argv[1],'w').write('x'); time.sleep(600)"]


def _cli(*args: str) -> "subprocess.CompletedProcess[str]":
    return subprocess.run([PY, "-m", "supervisor", *args], capture_output=True, text=True, timeout=120, cwd=str(ROOT))


class Tricklers:
    """``n`` clients that each send a partial request, then one byte every 0.1 s, and reconnect
    as soon as the server drops them."""

    def __init__(self, path: Path, n: int) -> None:
        self.path = path
        self.socks: list[socket.socket | None] = [None] * n
        self.connects = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _connect(self) -> socket.socket | None:
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.settimeout(2)
        try:
            c.connect(str(self.path))
            c.send(b'{"verb": ')
        except OSError:
            c.close()
            return None
        self.connects += 1
        return c

    def _run(self) -> None:
        while not self._stop.is_set():
            for i, c in enumerate(self.socks):
                try:
                    if c is None:
                        raise OSError("not connected")
                    c.send(b" ")
                except OSError:
                    if c is not None:
                        c.close()
                    self.socks[i] = self._connect()
            self._stop.wait(0.1)

    def __enter__(self) -> "Tricklers":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        for c in self.socks:
            if c is not None:
                c.close()


def test_seventeen_reconnecting_tricklers_do_not_hold_off_cli_status_and_stop(daemons, tmp_path):
    sd, ready = tmp_path / "sd", tmp_path / "ready"
    d = daemons(["wrap", "--state-dir", str(sd), "--backoff", "0", "--grace", "2", "--"] + SLEEPER + [str(ready)])
    wait_for(ready.exists, 30, what="job ready")
    with Tricklers(sd / "control.sock", 17) as t:
        wait_for(lambda: t.connects > 17, 30, what="tricklers pushed out and reconnecting")
        st = _cli("status", "--state-dir", str(sd))
        assert st.returncode == 0, st.stderr
        stop = _cli("stop", "--state-dir", str(sd))
        assert stop.returncode == 0, stop.stderr
        assert d.wait(60) == 0
    assert "Traceback" not in d.stderr()
