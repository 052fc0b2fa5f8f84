"""A real etcd on loopback for the cluster tests: installed on demand (Debian's etcd-server,
like tests/systemd installs its tools), started with free ports and a temporary data dir,
polled for health, stopped; it can be restarted on the same ports and data (etcd restarted
mid-run). :class:`Unavailable` carries the reason a test is skipped."""

from __future__ import annotations

import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

from tests.helpers.apt import apt_install

if TYPE_CHECKING:
    from tests.cluster.security import Pki

PACKAGES = ("etcd-server",)


class Unavailable(Exception):
    """etcd cannot be installed or started here; the message is the skip reason."""


def etcd_binary() -> str:
    """The etcd binary, installing Debian's etcd-server when it is missing (root, apt-get)."""
    found = shutil.which("etcd") or (Path("/usr/bin/etcd").exists() and "/usr/bin/etcd")
    if found:
        return str(found)
    why = apt_install(PACKAGES, timeout_s=600)
    found = shutil.which("etcd") or (Path("/usr/bin/etcd").exists() and "/usr/bin/etcd")
    if why is not None or not found:
        raise Unavailable(f"etcd is not installed and {why or 'etcd-server installed no etcd binary'}")
    # The package enables a system etcd.service on 2379; where systemd runs it, it is not ours to
    # stop, and our instances use other ports.
    return str(found)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EtcdServer:
    """One etcd member on 127.0.0.1 (client and peer ports chosen free at construction)."""

    def __init__(self, data_dir: Path, binary: str | None = None, host: str = "127.0.0.1",
                 tls: Pki | None = None) -> None:
        self.host = host  # the partition test listens on its bridge's address
        self.tls = tls  # https:// with client-certificate auth (tests/cluster/security.py)
        self.binary = binary or etcd_binary()
        self.data_dir = data_dir
        self.client_port = free_port()
        self.peer_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"{data_dir.name}.log"

    @property
    def endpoint(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.client_port}"

    def start(self, timeout: float = 20.0) -> None:
        peer = f"http://{self.host}:{self.peer_port}"
        argv = [self.binary, "--name", "tsup-test", "--data-dir", str(self.data_dir),
                "--listen-client-urls", self.endpoint, "--advertise-client-urls", self.endpoint,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"tsup-test={peer}", "--initial-cluster-state", "new",
                "--log-level", "warn", *(self.tls.etcd_args() if self.tls else [])]
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while not self.healthy():
            if self.proc.poll() is not None:
                raise Unavailable(f"etcd exited {self.proc.returncode} at start: {self._log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise Unavailable(f"etcd not healthy within {timeout:g} s: {self._log_tail()}")
            time.sleep(0.05)

    def healthy(self) -> bool:
        try:
            ctx: ssl.SSLContext | None = self.tls.client_context() if self.tls else None
            with urllib.request.urlopen(self.endpoint + "/health", timeout=1, context=ctx) as r:
                return b'"true"' in r.read()
        except OSError:
            return False

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def restart(self) -> None:
        """Stop and start again on the same ports and data dir (the keys and leases survive)."""
        self.stop()
        self.start()

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-500:]
        except OSError:
            return ""
