"""The look at a silent job: CPU time and py-spy stack samples of every process (effects).

:class:`ProcessProbe` is the small port (psutil for the process tree and its CPU time, py-spy for
the stacks); :func:`take_look` runs the look with it and writes every sample into a stacks file,
which is the hang's evidence when the verdict (:func:`supervisor.watch.busy.judge`) is "hung".

py-spy runs with ``--nonblocking``: it reads the process's memory without stopping it, so it
also reads a SIGSTOPped process (the blocking dump fails with "Failed to suspend process" there)
and never pauses a job that is working (a sample costs about 10 ms). ``--locals`` adds the local
values, which tell a loop of short calls on one line from one call that never returns
(:func:`supervisor.watch.busy.stack_signature`); the stacks file keeps the frames only. The
samples of all processes are taken at once, each bounded by ``sample_timeout_s``, every
``SAMPLE_EVERY_S`` across the window, so a look takes ``window_s`` plus one sample however many
ranks the job has.
"""
from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Protocol, Sequence

import psutil

from .. import childio
from .busy import Look, ProcSample, Verdict, judge, stack_signature, without_locals
from .stacks import DUMP_BYTES, find_py_spy

SAMPLE_EVERY_S = 0.5


@dataclass(frozen=True)
class Stack:
    """One py-spy sample of one process: its text, or why there is none."""

    text: str
    error: str | None = None


class ProcessProbe(Protocol):
    def processes(self, root_pid: int) -> dict[int, str]: ...  # pid -> short name
    def cpu_seconds(self, pids: Sequence[int]) -> dict[int, float]: ...
    def stopped(self, pids: Sequence[int]) -> set[int]: ...
    def stacks(self, pids: Sequence[int], timeout_s: float) -> dict[int, Stack]: ...


class SystemProbe:
    """psutil and py-spy."""

    def __init__(self, py_spy: str | None = None) -> None:
        self.py_spy = py_spy or find_py_spy()

    def processes(self, root_pid: int) -> dict[int, str]:
        try:
            root = psutil.Process(root_pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return {}
        out: dict[int, str] = {}
        for p in procs:
            try:
                if p.status() == psutil.STATUS_ZOMBIE:
                    continue
                cmd = [c.splitlines()[0] if c.strip() else c for c in p.cmdline()[:3]]  # python -c "<script>"
                out[p.pid] = " ".join(os.path.basename(c) for c in cmd)[:60] or p.name()
            except psutil.Error:
                continue
        return out

    def cpu_seconds(self, pids: Sequence[int]) -> dict[int, float]:
        out: dict[int, float] = {}
        for pid in pids:
            try:
                t = psutil.Process(pid).cpu_times()
                out[pid] = t.user + t.system
            except psutil.Error:
                continue
        return out

    def stopped(self, pids: Sequence[int]) -> set[int]:
        out: set[int] = set()
        for pid in pids:
            try:
                if psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
                    out.add(pid)
            except psutil.Error:
                continue
        return out

    def stacks(self, pids: Sequence[int], timeout_s: float) -> dict[int, Stack]:
        if self.py_spy is None:
            return {pid: Stack("", "py-spy is not installed") for pid in pids}
        running: dict[int, subprocess.Popen[bytes]] = {}
        out: dict[int, Stack] = {}
        for pid in pids:
            try:
                argv = [self.py_spy, "dump", "--nonblocking", "--locals", "--pid", str(pid)]
                running[pid] = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                start_new_session=True)
            except OSError as exc:
                out[pid] = Stack("", f"py-spy could not run: {exc}")
        deadline = time.monotonic() + timeout_s
        for pid, proc in running.items():
            # Read to bounded heads/tails (childio): a dump with every local of every thread is large.
            res = childio.drain(proc, timeout_s=max(0.1, deadline - time.monotonic()), keep=DUMP_BYTES,
                                stdout_head=True)
            if res.timed_out:
                childio.kill_group(proc)
                out[pid] = Stack("", f"py-spy did not answer within {timeout_s:g} s")
                continue
            text = res.stdout.decode(errors="replace")
            first_err = (res.stderr_tail(2000).splitlines() or [""])[0]
            out[pid] = Stack(text, None if res.returncode == 0 else f"py-spy exited {res.returncode}: {first_err}")
        return out


@dataclass(frozen=True)
class LookResult:
    verdict: Verdict
    look: Look
    stacks_file: Path | None
    seconds: float  # how long the look took

    def to_json(self) -> dict[str, object]:
        return {**self.verdict.to_json(), "window_s": round(self.look.window_s, 3), "seconds": round(self.seconds, 3),
                "stacks_file": str(self.stacks_file) if self.stacks_file else None}


def take_look(probe: ProcessProbe, root_pid: int, *, window_s: float, sample_timeout_s: float,
              stacks_dir: Path | None, label: str, wait: Callable[[float], object] = time.sleep,
              clock: Callable[[], float] = time.monotonic) -> LookResult:
    """Sample the stacks every ``SAMPLE_EVERY_S`` for ``window_s`` (``wait``: a cancellable wait
    in the daemon), with the CPU time at both ends; judge."""
    started = clock()
    names = probe.processes(root_pid)
    pids = sorted(names)
    cpu0 = probe.cpu_seconds(pids)
    t0 = clock()
    rounds = [probe.stacks(pids, sample_timeout_s)]
    n = max(1, round(window_s / SAMPLE_EVERY_S))
    for i in range(1, n + 1):
        if wait(max(0.0, t0 + window_s * i / n - clock())):
            break  # cancelled: the attempt is over, the verdict will be dropped
        rounds.append(probe.stacks(pids, sample_timeout_s))
    cpu1 = probe.cpu_seconds(pids)
    window = clock() - t0
    stopped = probe.stopped(pids)
    procs = []
    for pid in pids:
        if pid not in cpu1 and pid not in stopped:
            continue  # ended during the look
        used = cpu1[pid] - cpu0[pid] if pid in cpu0 and pid in cpu1 else None
        seen = [r.get(pid) for r in rounds]
        procs.append(ProcSample(pid, names[pid], used, pid in stopped,
                                tuple(stack_signature(s.text) if s and not s.error else None for s in seen)))
    look = Look(window, tuple(procs))
    verdict = judge(look)
    path = None
    if stacks_dir is not None:
        path = write_stacks(stacks_dir, label, look, verdict, rounds)
    return LookResult(verdict, look, path, clock() - started)


def write_stacks(out_dir: Path, label: str, look: Look, verdict: Verdict,
                 rounds: Sequence[Mapping[int, Stack]]) -> Path | None:
    """``out_dir/stacks-<label>-<time>.txt``: the verdict, then every process's samples (one
    shown again only when it differs from the one before)."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"stacks-{label}-{time.strftime('%Y%m%dT%H%M%S')}-{threading.get_ident() % 10000}.txt"
        with open(path, "w", encoding="utf-8") as f:
            f.write(f"# {'busy' if verdict.busy else 'hung'}: {verdict.reason}\n")
            f.write(f"# {len(rounds)} py-spy samples over {look.window_s:.1f} s of {len(look.procs)} process(es)\n")
            for p in look.procs:
                cpu = "?" if p.cpu_s is None else f"{p.cpu_s:.2f} s"
                f.write(f"\n===== pid {p.pid} ({p.name}): {verdict.states[p.pid]}, CPU {cpu} in the window, "
                        f"{len(set(p.readable))} distinct stack(s) in {len(p.samples)} samples "
                        "(frames, and the main thread's local values, not shown)\n")
                shown: str | None = None
                for i, (r, sig) in enumerate(zip(rounds, p.samples)):
                    sample = r.get(p.pid)
                    if sample is None or sample.error:
                        f.write(f"--- sample {i + 1}: {sample.error if sample else 'not sampled'}\n")
                    elif sig != shown or i == len(rounds) - 1:
                        f.write(f"--- sample {i + 1}\n{without_locals(sample.text).rstrip()}\n")
                        shown = sig
                    else:
                        f.write(f"--- sample {i + 1}: the same stack and locals\n")
        return path
    except OSError:
        return None  # the verdict stands without its file; the caller says there is none
