"""Which NVML events are the job's (issue 39 item 2), for :class:`~.gpumonitor.GpuMonitor`.

NVML's event carries the device and, on MIG, the GPU and compute instance; never the process. So:

* an event of a GPU the job does not use, or of a MIG slice that is not the job's, is noted
  (``gpu_xid_foreign``), never acted on: a co-tenant's fault must not restart a healthy job;
* an application-level Xid (13, 31, 43, ...) on the job's GPU while that GPU lists compute
  processes and none is the job's is another process's (a notebook on a shared GPU): noted too.
  An empty or unreadable list (a pid namespace) proves nothing: the Xid is taken as the job's;
* events queued before an attempt started (the last attempt's crash or kill raised them, and the
  event set lives across attempts) are drained when the attempt starts (``gpu_events_stale``).
"""
from __future__ import annotations

from typing import AbstractSet, Mapping

import structlog

from .devices import Selection
from .gpu import GpuBackend, GpuEvent
from .gpureading import DeviceReading
from .xid import XidInfo, XidLevel

log = structlog.get_logger("supervisor.health")

_DRAIN_MAX = 10_000  # stale events dropped at an attempt's start, at most (NVML hands one per wait)


def describe(ev: GpuEvent) -> str:
    slice_ = f" (MIG GI {ev.gpu_instance}, CI {ev.compute_instance})" if ev.gpu_instance is not None else ""
    return f"{ev.kind.value}{'' if ev.code is None else ' ' + str(ev.code)} on GPU {ev.index}{slice_}"


def drain_stale(backend: GpuBackend) -> int:
    """Drop the events queued before this attempt; returns how many (said once, with a sample)."""
    stale: list[GpuEvent] = []
    while len(stale) < _DRAIN_MAX:
        got = backend.wait_events(0.0)
        if not got:
            break
        stale.extend(got)
    if stale:
        log.info("gpu_events_stale", count=len(stale), events=[describe(e) for e in stale[:8]],
                 next="raised before this attempt started: recorded here, not acted on")
    return len(stale)


def foreign(ev: GpuEvent, info: XidInfo | None, sel: Selection, readings: Mapping[int, DeviceReading],
            job_pids: AbstractSet[int]) -> str | None:
    """Why ``ev`` is not the job's (None: it is). ``info`` is the Xid's meaning (None: an ECC event)."""
    if not sel.watches(ev.index):
        return "a GPU the job does not use"
    if not sel.owns_slice(ev.index, ev.gpu_instance, ev.compute_instance):
        return "a MIG slice the job does not use"
    if info is not None and info.level is XidLevel.APPLICATION:
        r = readings.get(ev.index)
        procs = set(r.processes) if r is not None else set()
        if procs and job_pids and not (procs & job_pids):
            return "an application error while only other processes use this GPU"
    return None


def note_foreign(ev: GpuEvent, why: str, label: str) -> None:
    log.warning("gpu_xid_foreign", what=describe(ev), device=label, why=why,
                next="noted; another process's or GPU's fault does not stop the job")
