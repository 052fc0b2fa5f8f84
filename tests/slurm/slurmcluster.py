"""A real single-node Slurm for the Slurm test: Debian's slurm-wlm and munge, installed on demand
(like tests/cluster/etcdserver.py installs etcd), started as root with their own key, socket,
ports, state and spool dirs under one temporary dir, and stopped with every process they started.
:class:`Unavailable` carries the reason a test is skipped.

Settings that keep the test short (each one is said in docs/operating.md where a user needs it):
``AuthInfo=cred_expire=10``: a requeued job may start again after 10 s instead of 120 s;
``SchedulerParameters=sched_interval=1``, ``MinJobAge=300`` (the finished job stays visible to
``scontrol``); ``ProctrackType=proctrack/linuxproc`` and ``TaskPlugin=task/none``: no cgroups in a
container; no accounting daemon (``sacct`` needs slurmdbd), ``JobCompType=jobcomp/filetxt``
records each end of a job instead.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable

from tests.helpers.apt import apt_install

PACKAGES = ("slurm-wlm", "munge")
MARK = "TSUP_SLURM_TEST_ROOT"  # in the environment of every process this cluster starts


class Unavailable(Exception):
    """Slurm cannot be installed or started here; the message is the skip reason."""


def _binaries() -> bool:
    return all(shutil.which(b) or Path(f"/usr/sbin/{b}").exists()
               for b in ("munged", "slurmctld", "slurmd", "sbatch", "scontrol"))


def install() -> None:
    """Install slurm-wlm and munge with apt-get when they are missing (root only)."""
    if _binaries():
        return
    why = apt_install(PACKAGES)
    if why is not None or not _binaries():
        raise Unavailable(f"Slurm is not installed and {why or 'slurm-wlm/munge installed no binaries'}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sbin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class SlurmCluster:
    """munged, slurmctld and slurmd for one node named after this host, on 127.0.0.1."""

    def __init__(self) -> None:
        # Not under pytest's tmp_path: munged refuses a socket whose directories are not
        # searchable by everyone (pytest's base dir is mode 700).
        self.root = Path(tempfile.mkdtemp(prefix="tsup-slurm-"))
        self.root.chmod(0o755)
        self.host = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.sock"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def env(self) -> dict[str, str]:
        """The environment for Slurm commands (sbatch, scontrol) that talk to this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf), MARK: str(self.root)}

    def write_conf(self) -> None:
        r = self.root
        for d in ("munge", "state", f"spool/{self.host}", "log"):
            (r / d).mkdir(parents=True, exist_ok=True)
            (r / d).chmod(0o755)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o400)
        cpus = os.cpu_count() or 1
        self.conf.write_text(f"""\
ClusterName=tsuptest
SlurmctldHost={self.host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket},cred_expire=10
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={r}/log/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
MinJobAge=300
ReturnToService=2
MpiDefault=none
SwitchType=switch/none
NodeName={self.host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=tsup Nodes={self.host} Default=YES MaxTime=INFINITE State=UP
""")

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "ab")
        try:
            self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                                env=self.env, start_new_session=True)
        finally:
            log.close()

    def _wait(self, what: str, name: str, ok: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ok():
            proc = self.procs[name]
            if proc.poll() is not None:
                raise Unavailable(f"{name} exited {proc.returncode} at start: {self.log_tail(name)}")
            if time.monotonic() > deadline:
                raise Unavailable(f"{what} not within {timeout:g} s: {self.log_tail(name)}")
            time.sleep(0.1)

    def log_tail(self, name: str, n: int = 600) -> str:
        p = self.root / "log" / f"{name}.out"
        return p.read_text(errors="replace")[-n:] if p.exists() else "(no output)"

    def start(self, timeout: float = 60.0) -> None:
        self.write_conf()
        m = self.root / "munge"
        self._spawn("munged", [_sbin("munged"), "--foreground", f"--socket={self.munge_socket}",
                               f"--key-file={m}/munge.key", f"--pid-file={m}/munged.pid",
                               f"--log-file={m}/munged.log", f"--seed-file={m}/munged.seed"])
        self._wait("munged's socket", "munged", self.munge_socket.exists, timeout)
        self._spawn("slurmctld", [_sbin("slurmctld"), "-D", "-f", str(self.conf)])
        self._wait("slurmctld answering", "slurmctld", lambda: self.scontrol("ping").returncode == 0
                   and "UP" in self.scontrol("ping").stdout, timeout)
        self._spawn("slurmd", [_sbin("slurmd"), "-D", "-f", str(self.conf), "-N", self.host])
        self._wait(f"node {self.host} idle", "slurmd", lambda: "State=IDLE" in self.scontrol(
            "show", "node", self.host).stdout, timeout)

    def scontrol(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=30, env=self.env)

    def sbatch(self, *args: str, env: dict[str, str] | None = None) -> str:
        """Submit (the job gets this environment, plus ``env``); returns the job id."""
        r = subprocess.run(["sbatch", "--parsable", *args], capture_output=True, text=True, timeout=30,
                           env={**self.env, **(env or {})})
        if r.returncode != 0:
            raise AssertionError(f"sbatch failed ({r.returncode}): {r.stderr.strip()}")
        return r.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as a dict (JobState, Restarts, ExitCode, ...); {} once it is gone."""
        r = self.scontrol("show", "job", "--oneliner", job_id)
        fields: dict[str, str] = {}
        for word in r.stdout.split():
            key, sep, value = word.partition("=")
            if sep and key not in fields:
                fields[key] = value
        return fields

    def jobcomp(self, job_id: str) -> list[dict[str, str]]:
        """Slurm's completion records of a job (jobcomp/filetxt), one per end of a run: a requeued
        run ends as ``JobState=PENDING``, the last one as ``COMPLETED``."""
        path = self.root / "log" / "jobcomp.txt"
        records = []
        for line in (path.read_text().splitlines() if path.exists() else []):
            fields = dict(w.partition("=")[::2] for w in line.split() if "=" in w)
            if fields.get("JobId") == job_id:
                records.append(fields)
        return records

    def leftovers(self) -> list[int]:
        """Processes of this cluster still running (none once :meth:`stop` has returned)."""
        return self._ours()

    def _ours(self) -> list[int]:
        """Processes this cluster started, found by the mark in their environment: the daemons,
        slurmstepd (which detaches from slurmd) and the batch jobs with their children."""
        mark = f"{MARK}={self.root}".encode()
        pids = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit() or int(d.name) == os.getpid():
                continue
            try:
                if mark in (d / "environ").read_bytes().split(b"\0"):
                    pids.append(int(d.name))
            except OSError:
                continue
        return pids

    def _job_processes(self) -> list[int]:
        """Ours, less the daemons and their own helpers (slurmctld's slurmscriptd): slurmstepd
        and what runs under it (it detaches from slurmd, so its parent is not a daemon)."""
        daemons = {p.pid for p in self.procs.values()}
        left = []
        for pid in self._ours():
            try:
                ppid = int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if pid not in daemons and ppid not in daemons:
                left.append(pid)
        return left

    def stop(self, keep_logs: Path | None = None) -> None:
        """Cancel every job, stop the daemons, then end any process of ours still left; copy the
        logs to ``keep_logs`` (for a failing test's report), remove the dir. Safe to call twice."""
        if self.procs.get("slurmctld") and self.procs["slurmctld"].poll() is None:
            subprocess.run(["scancel", "--full", "--user=root"], capture_output=True, timeout=30, env=self.env)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and self._job_processes():
                time.sleep(0.2)  # the jobs' processes end on scancel; the daemons stay until below
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        for pid in self._ours():  # a slurmstepd or job that outlived its daemons
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while self._ours() and time.monotonic() < deadline:
            time.sleep(0.1)  # SIGKILL is not instant; a zombie no longer shows its environment
        if keep_logs is not None and (self.root / "log").is_dir():
            shutil.copytree(self.root / "log", keep_logs, dirs_exist_ok=True)
        shutil.rmtree(self.root, ignore_errors=True)
