"""Busy or stuck: the verdict of a look at a silent job, before it is stopped as hung (pure).

At the liveness timeout the daemon looks before it kills (:mod:`supervisor.watch.look` takes
the samples): the CPU time each process of the job used over a short window, and py-spy stack
samples across it: the first and the last a few seconds apart, and a few between (two alone
often coincide on a job that is working: a tight loop spends most of its time on one hot line,
and both samples land there). :func:`judge` decides from them alone, so it is tested with
scripted samples.

One process is

- ``stopped`` when the kernel says so (SIGSTOP, a debugger): it cannot move on its own;
- ``working`` when its Python stacks differ between samples **and** it used CPU (an
  evaluation loop, a checkpoint being serialised). A sample is the frames of every thread and
  the local values of the main thread's frames (``py-spy dump --locals``): a loop of short C
  calls (``loss += model(x).item()``) spends nearly all its time on one line, so every sample of
  a working eval can show the same frames (seen on a real DDP eval: 7 samples, one line, a false
  hang), but its locals (the batch, the counter, the running sum) change from one to the next,
  while those of a call that never returns (a dead collective) do not; when py-spy could not read it, CPU alone
  says working (we cannot tell a spin from work, and saying "hung" would bring back the false
  hangs of silent evaluations);
- ``spinning`` when it used CPU but every sample shows the same stack and the same main-thread
  locals (a busy-wait in one call: NCCL's spin in a dead collective looks like this);
- ``waiting`` when it used no CPU (a sleep, a blocked recv, a gloo collective with a dead peer).

The job is **busy** when at least one process works and none is stopped; else it is **hung**.
With several ranks this is the rule that matters: a rank stuck (stopped, or blocked forever)
while the others wait in the collective for it leaves nobody working, so the job is hung; a
silent evaluation on every rank, or on rank 0 while the others wait at a barrier, has a working
rank, so the job is busy (bounded by ``[heartbeat] max_busy_s``). A single Python line that
computes for longer than the look (one huge C call) has a still stack and looks like a spin.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Mapping, Sequence

# A process using less than this share of one core over the window is idle (the torchrun agent's
# 5 s poll, a heartbeat thread); an evaluation or a save uses most of a core.
MIN_CPU_SHARE = 0.05


class ProcState(StrEnum):
    WORKING = "working"
    SPINNING = "spinning"
    WAITING = "waiting"
    STOPPED = "stopped"


@dataclass(frozen=True)
class ProcSample:
    """What a look saw of one process: CPU seconds over the window, and its stack samples in
    order (normalised by :func:`stack_signature`; None: py-spy could not read it that time)."""

    pid: int
    name: str
    cpu_s: float | None
    stopped: bool
    samples: tuple[str | None, ...]

    @property
    def readable(self) -> tuple[str, ...]:
        return tuple(x for x in self.samples if x is not None)

    @property
    def moved(self) -> bool | None:
        """Did the stack change across the samples (None: fewer than two could be read)."""
        seen = self.readable
        return len(set(seen)) > 1 if len(seen) >= 2 else None


@dataclass(frozen=True)
class Look:
    window_s: float
    procs: tuple[ProcSample, ...]


@dataclass(frozen=True)
class Verdict:
    busy: bool
    reason: str  # one line for people: who works, or why nobody does
    states: Mapping[int, ProcState]

    def to_json(self) -> dict[str, object]:
        return {"busy": self.busy, "reason": self.reason,
                "states": {str(pid): str(state) for pid, state in sorted(self.states.items())}}


def stack_signature(dump: str) -> str | None:
    """The part of one ``py-spy dump [--locals]`` that says where each thread is: thread names
    and frames, and the main thread's local values, without the thread's run state ("active",
    "idle", "gil" flicker between samples of a job that stands still) and without the process
    header. Other threads' locals are left out: a helper thread that wakes on a timer (a
    keep-alive, a progress bar's monitor) makes new locals at every tick while the job stands
    still; values py-spy could not read (``?``, a value being written) too. None when the dump
    shows no thread."""
    out: list[str] = []
    main = False
    pid = ""
    for line in dump.splitlines():
        if line.startswith("Process "):
            pid = line.split()[1].rstrip(":")
        elif line.startswith("Thread "):
            # Thread 6194 (active+gil): "MainThread"  ->  Thread 6194 "MainThread"
            head, _, rest = line.partition(" (")
            name = rest.partition(")")[2].lstrip(": ").strip()
            out.append(f"{head} {name}".rstrip())
            # The main thread has the process's id (py-spy names a thread only once the
            # process has imported threading).
            main = name == '"MainThread"' or head == f"Thread {pid}"
        elif line.startswith((" ", "\t")) and out:
            text = line.strip()
            if _indent(line) <= 4:
                out.append(text)  # a frame
            elif main and not text.endswith(": ?"):
                out.append(text)  # "Arguments:", "Locals:" and the main thread's values
    return "\n".join(out) if out else None


def without_locals(dump: str) -> str:
    """A ``py-spy dump --locals`` as people read it in the evidence: the frames only (local
    values may hold data or secrets, and they stay out of the state dir)."""
    return "\n".join(line for line in dump.splitlines()
                     if not (line.startswith((" ", "\t")) and _indent(line) > 4))


def _indent(line: str) -> int:
    return len(line.expandtabs(4)) - len(line.expandtabs(4).lstrip())


def state_of(p: ProcSample, window_s: float) -> ProcState:
    if p.stopped:
        return ProcState.STOPPED
    used = p.cpu_s is not None and window_s > 0 and p.cpu_s / window_s >= MIN_CPU_SHARE
    if not used:
        return ProcState.WAITING
    if p.moved is None:
        return ProcState.WORKING  # CPU alone (see the module doc)
    return ProcState.WORKING if p.moved else ProcState.SPINNING


def _share(p: ProcSample, window_s: float) -> str:
    if p.cpu_s is None or window_s <= 0:
        return "CPU unknown"
    return f"{100 * p.cpu_s / window_s:.0f}% CPU"


def judge(look: Look) -> Verdict:
    """Busy or hung, and why (see the module doc)."""
    states = {p.pid: state_of(p, look.window_s) for p in look.procs}
    if not look.procs:
        return Verdict(False, "no process of the job is left to look at", states)
    by_state: dict[ProcState, list[ProcSample]] = {}
    for p in look.procs:
        by_state.setdefault(states[p.pid], []).append(p)

    def names(ps: Sequence[ProcSample], how: str) -> str:
        shown = ", ".join(f"pid {p.pid} ({p.name}, {_share(p, look.window_s)})" for p in ps[:4])
        more = f" and {len(ps) - 4} more" if len(ps) > 4 else ""
        return f"{shown}{more} {how}"

    stopped = by_state.get(ProcState.STOPPED, [])
    if stopped:
        return Verdict(False, names(stopped, "stopped (SIGSTOP or a debugger): cannot move on its own"), states)
    working = by_state.get(ProcState.WORKING, [])
    if working:
        how = ("working: stacks moved" if all(p.moved for p in working)
               else "working (CPU only: py-spy could not read the stacks)")
        return Verdict(True, names(working, f"{how} over {look.window_s:.1f} s"), states)
    parts = []
    if spinning := by_state.get(ProcState.SPINNING, []):
        parts.append(names(spinning, "spinning: CPU but the same stack"))
    if waiting := by_state.get(ProcState.WAITING, []):
        parts.append(names(waiting, "waiting: no CPU"))
    return Verdict(False, "nobody works: " + "; ".join(parts), states)
