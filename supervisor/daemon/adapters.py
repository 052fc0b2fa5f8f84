"""The real job launcher port: the job's processes, their output, how they ended (as a cause: an
exit code, a killing signal, and for a SIGKILL the OOM killer's evidence, the kernel log and our
cgroup's oom_kill counter: :func:`classify_exit`).

The checkpoint store and the health gate are :mod:`supervisor.daemon.checkpointstore` and
:mod:`supervisor.daemon.healthconcern`."""

from __future__ import annotations

import os
import re
import signal
from dataclasses import replace
from pathlib import Path
from typing import Any, BinaryIO, Callable, Mapping, Sequence

import structlog

from ..core.messages import ExitInfo
from ..events import Cause
from ..job import torchelastic
from ..job.cgroup import own_cgroup, sweep_empty
from ..job.osapi import OsApi, become_subreaper, signal_name
from ..job.consoleline import STDERR_LINE, shares_stderr
from ..job.console import Consoles, ConsoleWriter
from ..job.output import SinkFanout
from ..job.prewarm import Prewarm
from ..job.process import JobProcess, LaunchSpec
from ..job.torchrunlog import TorchrunOutput
from .ckptsignal import blame_supervisor_signal
from .ports import Job

log = structlog.get_logger("supervisor.daemon")


class ProcessLauncher:
    """Real processes: :class:`~supervisor.job.process.JobProcess`, output to the fanout and the
    passthrough, exits classified with the kernel's and the cgroup's OOM evidence."""

    def __init__(self, fanout: SinkFanout, passthrough: BinaryIO | None, osapi: OsApi,
                 passthrough_err: BinaryIO | None = None) -> None:
        self.fanout = fanout
        # The job's stdout to ``passthrough`` (our stdout), its stderr to ``passthrough_err`` (our
        # stderr), each through a thread of its own with a bounded buffer: a console that stops
        # reading must never block the job's pipes (a false hang) or the main loop.
        # Both to one stream (the demo's console): one writer, so their chunks keep their order.
        out = _console(passthrough) if passthrough is not None else None
        err = (out if passthrough_err is passthrough
               else _console(passthrough_err) if passthrough_err is not None else None)
        named = {"output": out} if err is out else {"stdout": out, "stderr": err}
        self.writers = {name: w for name, w in named.items() if w is not None}
        self.passthrough = Consoles(out, err)
        self.osapi = osapi
        self._oom_kills_before: int | None = None
        self._subreaper = False
        self._cgroup_parent: Path | None = None
        self.prewarm: Prewarm | None = None  # [job] prewarm: made at the first launch that asks
        # Where an attempt's prewarm outcome goes (the environment record of its ledger row).
        self.note: Callable[[LaunchSpec, Mapping[str, Any]], None] = lambda spec, fields: None
        # The current attempt's output as torchrun's summary reads it (a script without @record).
        self._summary: tuple[JobProcess | None, TorchrunOutput] | None = None

    def launch(self, spec: LaunchSpec, log_path: Path | None, on_eof: Callable[[str], None]) -> JobProcess:
        if not self._subreaper:
            # Orphaned descendants of the job get re-parented to us (not init), so we can find and
            # reap them: nothing of a job survives a relaunch, and no zombie is left behind.
            self._subreaper = True
            become_subreaper()
            self._cgroup_parent = self._isolation(spec)
        self._oom_kills_before = cgroup_oom_kills()
        if not spec.prewarm and self.prewarm is not None:
            self.prewarm.close()  # the config turned it off: no standby outlives that
            self.prewarm = None
        if spec.prewarm and self.prewarm is None:
            self.prewarm = Prewarm()
        summary = TorchrunOutput(str(log_path or ""))
        if self._summary is not None:
            self.fanout.remove(self._summary[1])  # the previous attempt's: its pumps are done
        self.fanout.add(summary)  # before the spawn: no line of this attempt passes it by
        self._summary = (None, summary)
        job = JobProcess(spec, self.fanout, self.passthrough, log_path, on_eof, self.osapi,
                         cgroup_parent=self._cgroup_parent,
                         spawn=self.prewarm.spawn if self.prewarm is not None else None)
        self._summary = (job, summary)
        if spec.cgroup and job.cgroup is None:
            self._cgroup_parent = None  # it failed (and said why): not tried, nor said, at every launch
        if self.prewarm is not None:
            outcome, note = str(job.prewarm), getattr(job.prewarm, "note", "")
            log.info("prewarm_outcome", attempt=spec.env.get("TSUP_ATTEMPT"), outcome=outcome,
                     message=(f"the attempt started cold ({outcome[6:]})" if outcome != "used"
                              else "the attempt started in the standby interpreter, its imports done"
                              + (f"; its command line is the standby's: {note}" if note else "")))
            self.note(spec, {"prewarm": outcome})
            self.prewarm.after_launch(spec, self._cgroup_parent if spec.cgroup else None)
        return job

    @staticmethod
    def _isolation(spec: LaunchSpec) -> Path | None:
        """Where each attempt's cgroup goes (said once): our own cgroup when it is writable."""
        parent, why = own_cgroup()
        if not spec.cgroup:
            log.info("job_isolation", cgroup=None, message="[job] cgroup = false: the job's processes are "
                     "tracked by session, group and subreaper (an escaped one that scrubs its environment is missed)")
        elif parent is None:
            log.info("job_isolation", cgroup=None, reason=why,
                     message=f"no cgroup for the job ({why}); its processes are tracked by session, group and "
                             "subreaper (an escaped one that scrubs its environment is missed)")
        else:
            sweep_empty(parent)  # what daemons killed outright (no successor on their state dir) left
            log.info("job_isolation", cgroup=str(parent),
                     message=f"each attempt runs in a cgroup of its own under {parent}: a stop reaches every "
                             "process it started (cgroup.kill), wherever it went")
        return parent

    def discard_standby(self) -> None:
        if self.prewarm is not None:
            self.prewarm.discard()

    def progressed(self, now: float) -> None:
        if self.prewarm is not None:
            self.prewarm.progressed(now)

    def standby_status(self) -> dict[str, Any]:
        return self.prewarm.status() if self.prewarm is not None else {"state": "off"}

    def close(self) -> None:
        if self.prewarm is not None:
            self.prewarm.close()
        for name, writer in self.writers.items():
            if writer.dropped_bytes:
                log.warning("console_output_dropped", bytes=writer.dropped_bytes, stream=name,
                            message=f"{writer.dropped_bytes} bytes of the job's {name} were not shown on "
                                    "the console (it stopped reading); the job log file has every byte")
            writer.close(timeout=2.0)

    def exit_info(self, job: Job, *, evidence: bool) -> ExitInfo:
        if job.status is None:
            return ExitInfo(None, None, None, "not reaped")
        if not evidence:
            return blame_supervisor_signal(classify_exit(job.status, [], None), job)
        info = blame_supervisor_signal(classify_exit(job.status, list(job.known), self._oom_kills_before), job)
        if not isinstance(job, JobProcess):
            return info
        output = self._summary[1] if self._summary is not None and self._summary[0] is job else None
        return with_root_cause(info, job, output)


def with_root_cause(info: ExitInfo, job: JobProcess, output: TorchrunOutput | None = None) -> ExitInfo:
    """A failed attempt's exit with torchrun's root cause (the failing rank, its exception and
    last frame): from the TORCHELASTIC_ERROR_FILE the job left (job/torchelastic.py: @record),
    else from torchrun's summary and the rank's traceback in its output (job/torchrunlog.py)."""
    spec = job.spec
    path = spec.env.get(torchelastic.ENV)
    if info.cause is None:
        return info
    try:
        rc = torchelastic.read_root_cause(Path(path), argv=spec.argv, env=spec.env,
                                          since=job.leader.create_time) if path else None
        rc = rc or (output.root_cause() if output is not None else None)
    except Exception:  # evidence only: never in the way of deciding what to do with the exit
        log.warning("root_cause_unreadable", file=path, exc_info=True, next="the exit is judged without it")
        return info
    if rc is None:
        return info
    log.info("root_cause_found", file=rc.file, source=rc.source, rank=rc.rank, exception=rc.exc_type,
             last_frame=rc.last_frame, exit_code=rc.error_code, message=f"{info.summary}: {rc.line()}",
             next="kept in the attempt's detection and history")
    return replace(info, summary=f"{info.summary}: {rc.line()}", root_cause=rc.to_json())


def _console(stream: BinaryIO) -> ConsoleWriter:
    # A stream writing where our event lines go (stderr; stdout too when both are one terminal)
    # shares their line, so that an event never lands inside one of the job's lines.
    return ConsoleWriter(stream, line=STDERR_LINE if shares_stderr(stream) else None)


# -- how the job's process ended, as a cause ----------------------------------------------------
_OOM_KILL = re.compile(r"(?:Out of memory|Memory cgroup out of memory): Killed process (\d+)|oom-kill:.*?task_memcg=.*?pid=(\d+)|oom-kill:.*?pid=(\d+)")


def kernel_oom_evidence(pids: Sequence[int]) -> str | None:
    """Look in the kernel log for the OOM killer naming one of the job's pids.

    /dev/kmsg needs root (or CAP_SYSLOG); without it we simply have no evidence and the exit
    stays a plain ``crash`` (killed by SIGKILL).
    """
    wanted = {str(p) for p in pids}
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    found = None
    try:
        while True:
            try:
                rec = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError:  # EPIPE when a record was overwritten: keep reading
                continue
            if not rec:
                break
            text = rec.decode("utf-8", "replace")
            m = _OOM_KILL.search(text)
            if m and (m.group(1) or m.group(2) or m.group(3)) in wanted:
                found = text.split(";", 1)[-1].strip()
    finally:
        os.close(fd)
    return found


def cgroup_oom_kills() -> int | None:
    """The oom_kill counter of our own cgroup (v2), or None when not readable."""
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    path = Path("/sys/fs/cgroup") / line.strip()[3:].lstrip("/") / "memory.events"
                    for ev in path.read_text().splitlines():
                        k, _, v = ev.partition(" ")
                        if k == "oom_kill":
                            return int(v)
    except (OSError, ValueError):
        return None
    return None


def classify_exit(status: int, pids_seen: Sequence[int], oom_kills_before: int | None) -> ExitInfo:
    """Exit code / killing signal -> cause. SIGKILL with OOM-killer evidence -> ``oom``."""
    code = os.waitstatus_to_exitcode(status)
    if code == 0:
        return ExitInfo(0, None, None, "exited 0")
    if code > 0:
        return ExitInfo(code, None, Cause.CRASH, f"exit {code}")
    sig = -code
    name = signal_name(sig)
    if sig == signal.SIGKILL:
        evidence = kernel_oom_evidence(pids_seen)
        if evidence is None and oom_kills_before is not None:
            after = cgroup_oom_kills()
            if after is not None and after > oom_kills_before:
                evidence = f"memory.events oom_kill {oom_kills_before} -> {after} in our cgroup"
        if evidence:
            return ExitInfo(None, name, Cause.OOM, f"killed by {name} (kernel OOM killer)", evidence)
    return ExitInfo(None, name, Cause.CRASH, f"killed by {name}")
