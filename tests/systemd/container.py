"""Boot a real systemd in a container (systemd-nspawn) and run commands inside it.

The facts this relies on were measured on these machines (see shared/notes/real-systemd.md):
PID 1 here is not systemd, but systemd 252 boots fine under ``systemd-nspawn --boot`` from a
debootstrapped Debian bookworm rootfs. There is no system bus or machined on the host, hence
``--register=no --keep-unit`` and ``nsenter`` (not ``machinectl``/``systemctl -M``).

The rootfs is built once (debootstrap, ~40 s) and cached as a .tar.zst OUTSIDE the repository
(``$TSUP_ROOTFS_CACHE``, default /var/cache/tsup-test/rootfs-bookworm.tar.zst); each boot unpacks
a fresh copy (~1 s), so every test starts with an empty journal and no leftover units.

The project is not installed into the rootfs: the host's checkout and its virtual environment
(and the Python it was built from) are bind-mounted read-only at the same paths, so the
venv's absolute shebangs and the editable install resolve inside as they do outside.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

CACHE = Path(os.environ.get("TSUP_ROOTFS_CACHE", "/var/cache/tsup-test/rootfs-bookworm.tar.zst"))
PACKAGES = ("systemd-container", "debootstrap", "zstd")
INCLUDE = "systemd,dbus,python3"


class Unavailable(Exception):
    """Raised when a real systemd cannot be booted here; the message is the skip reason."""


def _run(argv: list[str], timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=check)


def _mirror() -> str:
    src = Path("/etc/apt/sources.list.d/debian.sources")
    if src.exists():
        for line in src.read_text().splitlines():
            if line.startswith("URIs:"):
                return line.split()[1]
    return "http://deb.debian.org/debian"


def ensure_tools() -> None:
    """Install systemd-nspawn, debootstrap and zstd if missing (Debian host, root)."""
    if os.geteuid() != 0:
        raise Unavailable("booting systemd in a container needs root (systemd-nspawn)")
    if all(shutil.which(t) for t in ("systemd-nspawn", "debootstrap", "zstd", "nsenter")):
        return
    if not shutil.which("apt-get"):
        raise Unavailable("systemd-nspawn/debootstrap missing and no apt-get to install them")
    # --no-install-recommends: the recommended libnss-mymachines would edit /etc/nsswitch.conf.
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]
    with _lock():
        r = subprocess.run(install, capture_output=True, text=True, timeout=600, env=env)
        if r.returncode != 0:
            # A fresh machine may have no package lists yet: fetch them once, then try again.
            subprocess.run(["apt-get", "update", "-q"], capture_output=True, text=True, timeout=600, env=env)
            r = subprocess.run(install, capture_output=True, text=True, timeout=600, env=env)
    if r.returncode != 0 or not shutil.which("systemd-nspawn"):
        raise Unavailable(f"could not install {' '.join(PACKAGES)}: {r.stderr.strip()[-300:]}")


class _lock:
    """A file lock so two test processes do not build the cache (or run apt) at once."""

    def __enter__(self) -> None:
        CACHE.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(CACHE.parent / ".lock", "w")
        fcntl.flock(self._f, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self._f, fcntl.LOCK_UN)
        self._f.close()


def ensure_rootfs_cache() -> Path:
    """Build the cached rootfs tarball once (debootstrap minbase + systemd, dbus, python3)."""
    if CACHE.exists():
        return CACHE
    ensure_tools()
    with _lock():
        if CACHE.exists():
            return CACHE
        build = Path(tempfile.mkdtemp(prefix="tsup-rootfs-", dir=CACHE.parent))
        try:
            r = subprocess.run(["debootstrap", "--variant=minbase", f"--include={INCLUDE}", "bookworm",
                                str(build), _mirror()], capture_output=True, text=True, timeout=900)
            if r.returncode != 0:
                raise Unavailable(f"debootstrap failed: {(r.stdout + r.stderr).strip()[-400:]}")
            build.chmod(0o755)
            for deb in (build / "var/cache/apt/archives").glob("*.deb"):
                deb.unlink()  # halves the cached tarball
            # The container's journal must keep everything the tests read back.
            conf = build / "etc/systemd/journald.conf.d"
            conf.mkdir(parents=True, exist_ok=True)
            (conf / "tsup-test.conf").write_text("[Journal]\nRateLimitBurst=0\nStorage=volatile\n")
            tmp = CACHE.with_suffix(".partial")
            _run(["tar", "--zstd", "-C", str(build), "-cf", str(tmp), "."], timeout=600)
            tmp.rename(CACHE)
        finally:
            shutil.rmtree(build, ignore_errors=True)
    return CACHE


@dataclass
class Container:
    """A booted container; ``sh(cmd)`` runs a shell command inside with nsenter."""

    name: str
    root: Path
    nspawn: subprocess.Popen[bytes]
    leader: int
    binds: tuple[str, ...] = field(default_factory=tuple)

    def exec(self, argv: list[str], timeout: float = 60, check: bool = True,
             input: str | None = None) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(["nsenter", "-t", str(self.leader), "-a", *argv], capture_output=True,
                           text=True, timeout=timeout, input=input)
        if check and r.returncode != 0:
            raise AssertionError(f"in container: {argv} exited {r.returncode}\n"
                                 f"stdout: {r.stdout[-2000:]}\nstderr: {r.stderr[-2000:]}")
        return r

    def sh(self, script: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.exec(["/bin/sh", "-c", script], timeout=timeout, check=check)

    def journal(self, *args: str) -> str:
        return self.exec(["journalctl", "-b", "--no-pager", "-q", *args], check=False).stdout

    def show(self, unit: str, prop: str) -> str:
        return self.exec(["systemctl", "show", "-P", prop, unit], check=False).stdout.strip()

    def shutdown(self) -> None:
        """SIGTERM nspawn (it powers the container off); SIGKILL the container's PID 1 if it
        lingers (killing nspawn alone would orphan the container); clean the cgroups it leaves."""
        if self.nspawn.poll() is None:
            self.nspawn.send_signal(signal.SIGTERM)
            try:
                self.nspawn.wait(timeout=15)
            except subprocess.TimeoutExpired:
                if self.leader > 1:  # never kill(-1, ...) or kill(0, ...): that is every process
                    try:
                        os.kill(self.leader, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                try:
                    self.nspawn.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.nspawn.kill()
                    self.nspawn.wait(timeout=10)
        _clean_cgroups(self.name)
        shutil.rmtree(self.root, ignore_errors=True)
        Path(f"{self.root}.nspawn.log").unlink(missing_ok=True)


def _own_cgroups() -> list[Path]:
    """Our cgroups in the hierarchies nspawn uses (--keep-unit puts the container's "payload"
    cgroup under the caller's own)."""
    out = []
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrl, path = line.split(":", 2)
        if ctrl == "name=systemd":
            out.append(Path("/sys/fs/cgroup/systemd") / path.lstrip("/"))
        elif ctrl == "":
            for base in (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup")):
                if (base / "cgroup.controllers").exists():
                    out.append(base / path.lstrip("/"))
                    break
    return out


def _clean_cgroups(name: str) -> None:
    """Remove the empty "payload" cgroups the container left under ours, and its runtime files
    (only this container's: another test may be running its own)."""
    for base in _own_cgroups():
        payload = base / "payload"
        if not payload.is_dir():
            continue
        for d in sorted((p for p in payload.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            try:
                d.rmdir()
            except OSError:
                pass
        try:
            payload.rmdir()
        except OSError:
            pass
    run = Path("/run/systemd/nspawn")
    for leftover in run.glob(f"*/{name}"):
        shutil.rmtree(leftover, ignore_errors=True)
    for d in [*run.glob("*"), run]:  # empty ones only: rmdir refuses the rest
        try:
            d.rmdir()
        except OSError:
            pass


def _leader(nspawn_pid: int, deadline: float) -> int:
    """The container's PID 1: the `systemd` child of the nspawn process."""
    while time.monotonic() < deadline:
        try:
            kids = Path(f"/proc/{nspawn_pid}/task/{nspawn_pid}/children").read_text().split()
        except FileNotFoundError:
            raise Unavailable("systemd-nspawn exited during boot") from None
        for k in kids:
            try:
                if Path(f"/proc/{k}/comm").read_text().strip() == "systemd":
                    return int(k)
            except FileNotFoundError:
                continue
        time.sleep(0.05)
    raise Unavailable("systemd did not start inside the container within the deadline")


def boot(binds: tuple[str, ...] = (), bind_ro: tuple[str, ...] = (), timeout: float = 60) -> Container:
    """Unpack a fresh rootfs and boot it; returns when `is-system-running` says running/degraded."""
    ensure_tools()
    cache = ensure_rootfs_cache()
    root = Path(tempfile.mkdtemp(prefix="tsup-ct-", dir=cache.parent))
    _run(["tar", "--zstd", "-C", str(root), "-xf", str(cache)])
    root.chmod(0o755)  # mkdtemp's 0700 would lock every non-root service (dbus) out of "/"
    name = f"tsup{os.getpid()}"
    log = open(root.parent / f"{root.name}.nspawn.log", "wb")
    argv = ["systemd-nspawn", "-q", "-D", str(root), "--boot", "--register=no", "--keep-unit",
            "-M", name, *[f"--bind={b}" for b in binds], *[f"--bind-ro={b}" for b in bind_ro]]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    log.close()
    deadline = time.monotonic() + timeout
    try:
        leader = _leader(proc.pid, deadline)
        ct = Container(name, root, proc, leader, binds)
        while True:
            r = ct.exec(["systemctl", "is-system-running", "--wait"], check=False,
                        timeout=max(1.0, deadline - time.monotonic()))
            if r.stdout.strip() in ("running", "degraded"):
                return ct
            if time.monotonic() > deadline:
                raise Unavailable(f"container systemd not running: {r.stdout.strip()} {r.stderr.strip()}")
            time.sleep(0.1)
    except BaseException:
        Container(name, root, proc, _safe_leader(proc.pid)).shutdown()
        raise


def _safe_leader(pid: int) -> int:
    try:
        return _leader(pid, time.monotonic() + 0.5)
    except Unavailable:
        return -1


if __name__ == "__main__":  # `python -m tests.systemd.container` prebuilds the cache
    print(ensure_rootfs_cache(), file=sys.stderr)
