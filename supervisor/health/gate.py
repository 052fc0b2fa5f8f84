"""The pre-launch health gate: run before every (re)launch; a failed gate means "give up".

Checks, in order, collecting every reason (the first one is the root cause):

1. GPU sight: the backend initialises. Blind -> the verdict is ``unavailable``: it passes with a
   warning, or fails when ``gpu.require = true``.
2. All expected GPUs present (``gpu.expected_devices``, else as many as seen at the first gate).
3. None lost, none with retired pages / remapped rows pending, none whose driver recovery action
   (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, r570+) asks for a reset or a reboot (those need it first).
   A device NVML refuses to read (NO_PERMISSION on a MIG parent or a denied handle, NOT_SUPPORTED,
   UNKNOWN) is "unknown": a warning naming it, never a crash; the other devices are checked as usual.
Only the job's GPUs are checked (``health/devices.py``: ``gpu.devices``, else the job's
``CUDA_VISIBLE_DEVICES`` / ``NVIDIA_VISIBLE_DEVICES``, else all): a foreign process holding memory
on another GPU never delays or stops the job.

4. The previous attempt's GPU memory released: every device below ``gpu.release_threshold`` of its
   memory and no pid of the previous attempt still holding any, waiting up to
   ``gpu.release_timeout_s`` (polling; ``clock``/``sleep`` injectable for tests).
5. The storage probe of the checkpoint dir passes (write, fsync, read back, remove, same mount).

Restarting onto a GPU that needs a reset, or while the old process still pins its memory, only
burns the restart budget: the runner gives up (exit 3) with ``reasons[0]``.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Collection, Mapping

import structlog

from ..core.causes import GateCheck
from .config import GpuConfig
from .devices import Selection, resolve
from .gpu import NEEDS_RESET, RECOVERY_ACTIONS, GpuBackend, GpuBlindError, GpuDeviceError, GpuLostError
from .gpureading import device_memory
from .host import ProbeResult, StorageBaseline, probe_storage

log = structlog.get_logger("supervisor.health")

_RELEASE_POLL_S = 0.5


@dataclass(frozen=True)
class GateVerdict:
    """``passed`` false: ``reasons`` say why (root cause first) and ``failed_checks`` which check
    failed for each (what the failure means: :func:`supervisor.core.causes.gate_failure`).
    ``warnings`` never block a launch."""

    passed: bool
    reasons: tuple[str, ...]
    waited_s: float
    details: Mapping[str, object] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    unavailable: bool = False  # GPU health could not be observed (blind)
    failed_checks: tuple[GateCheck, ...] = ()  # one per reason, in the same order

    def summary(self) -> str:
        if not self.passed:
            return "pre-launch gate failed: " + "; ".join(self.reasons)
        extra = (" (GPU health unavailable)" if self.unavailable else "") + (
            f" after waiting {self.waited_s:.1f} s for GPU memory" if self.waited_s >= 0.05 else "")
        return "pre-launch gate passed" + extra

    def to_dict(self) -> dict[str, object]:
        """For the ledger (``attempts.gate``): plain JSON types, plus ``summary`` (one line)."""
        d = asdict(self)
        d["reasons"], d["warnings"], d["details"] = list(self.reasons), list(self.warnings), dict(self.details)
        d["failed_checks"] = [c.value for c in self.failed_checks]
        d["summary"] = self.summary()
        return d


def run_gate(backend: GpuBackend, cfg: GpuConfig, previous_pids: Collection[int] = (),
             clock: Callable[[], float] = time.monotonic, *, sleep: Callable[[float], None] = time.sleep,
             checkpoint_dir: str | Path | None = None, storage_baseline: StorageBaseline | None = None,
             expected_devices: int | None = None, env: Mapping[str, str] | None = None) -> GateVerdict:
    """One gate run. ``expected_devices`` is the count seen at the first gate (``gpu.expected_devices`` wins);
    ``env`` the job's environment: its CUDA_VISIBLE_DEVICES names the GPUs checked (health/devices.py)."""
    t0 = clock()
    failures: list[tuple[GateCheck, str]] = []
    warnings: list[str] = []
    details: dict[str, object] = {}
    waited = 0.0
    unavailable = False
    try:
        backend.init()
        count = backend.device_count()
    except GpuBlindError as exc:
        unavailable = True
        details["gpu_unavailable"] = str(exc)
        msg = f"GPU health unavailable: {exc}"
        if cfg.require:
            failures.append((GateCheck.GPU_SIGHT, msg + " (gpu.require = true)"))
        else:
            warnings.append(msg + "; launching without GPU checks (set gpu.require = true to refuse)")
        count = None
    if count is not None:
        expected = cfg.expected_devices if cfg.expected_devices is not None else expected_devices
        details["device_count"] = count
        details["expected_devices"] = expected if expected is not None else count
        if expected is not None and count < expected:
            failures.append((GateCheck.GPU_COUNT,
                             f"only {count} of {expected} expected GPUs are visible: drain or reset this node"))
        sel = resolve(backend, cfg.devices, env or {}, say=False)  # in the verdict's details
        mine = [i for i in range(count) if sel.watches(i)]
        details["job_devices"] = sel.to_dict()
        warnings += [f"{sel.source} names {e!r}, which is not a GPU this node's NVML sees: not checked"
                     for e in sel.unresolved] + list(sel.notes)
        unknown: dict[int, str] = {}
        lost = _device_problems(backend, mine, failures, unknown, sel)
        if not lost:
            ok, waited, mem = _wait_for_release(backend, cfg, mine, frozenset(previous_pids), clock, sleep, unknown,
                                                sel)
            if unknown:
                details["unknown_devices"] = {str(i): why for i, why in sorted(unknown.items())}
                warnings += [f"{sel.label(i)} cannot be read ({why}): its health and memory are unknown; "
                             "launching on the GPUs that can be checked" for i, why in sorted(unknown.items())]
            details["memory"] = mem
            if not ok:
                failures.append((GateCheck.GPU_MEMORY, _release_reason(mem, cfg, waited)))
    if checkpoint_dir is not None:
        probe: ProbeResult = probe_storage(checkpoint_dir, storage_baseline)
        details["storage_probe"] = probe.to_dict()
        if not probe.ok:
            failures.append((GateCheck.STORAGE, f"storage probe failed: {probe.reason}"))
    details["seconds"] = round(clock() - t0, 3)
    return GateVerdict(not failures, tuple(r for _, r in failures), round(waited, 3), details, tuple(warnings),
                       unavailable, tuple(c for c, _ in failures))


def _device_problems(backend: GpuBackend, indices: list[int], failures: list[tuple[GateCheck, str]],
                     unknown: dict[int, str], sel: Selection) -> bool:
    """Appends a GPU_REPAIR failure per lost GPU or GPU needing a reset, notes in ``unknown`` the
    devices NVML refuses to read; True when one is lost."""
    lost = False
    for i in indices:
        try:
            pending = backend.pending_repair(i)
            recovery = backend.recovery_action(i)
        except GpuLostError:
            lost = True
            failures.append((GateCheck.GPU_REPAIR, f"{sel.label(i)} is lost (fell off the bus): drain or reset this node"))
            continue
        except GpuDeviceError as exc:
            unknown[i] = str(exc)
            continue
        if recovery in NEEDS_RESET:
            failures.append((GateCheck.GPU_REPAIR, f"{sel.label(i)}: the driver asks for a {RECOVERY_ACTIONS[recovery]} "
                                                   "(GPU recovery action): drain or reset this node"))
        if pending.needs_reset:
            what = ", ".join(name for name, flag in (
                ("retired pages pending", pending.retired_pages_pending),
                ("row remapping pending", pending.remap_pending),
                ("row remapping failed", pending.remap_failure)) if flag)
            failures.append((GateCheck.GPU_REPAIR, f"{sel.label(i)} needs a reset ({what}): drain or reset this node"))
    return lost


def _wait_for_release(backend: GpuBackend, cfg: GpuConfig, indices: list[int], previous: frozenset[int],
                      clock: Callable[[], float], sleep: Callable[[float], None], unknown: dict[int, str],
                      sel: Selection) -> tuple[bool, float, list[dict[str, object]]]:
    start = clock()
    logged = False
    while True:
        mem: list[dict[str, object]] = []
        busy = False
        for i in indices:
            if i in unknown:
                continue
            try:
                m = device_memory(backend, i, sel.slices(i))
                holders = sorted(p for p in backend.processes(i) if p in previous)
            except GpuDeviceError as exc:  # this device alone: unknown, never a crash of the gate
                unknown[i] = str(exc)
                continue
            frac = m.used / m.total if m.total else 0.0
            held = frac >= cfg.release_threshold or bool(holders)
            busy = busy or held
            mem.append({"device": i, "label": sel.label(i), "used_bytes": m.used, "total_bytes": m.total,
                        "fraction": round(frac, 4), "previous_pids_holding": holders, "released": not held})
        waited = clock() - start
        if not busy:
            return True, waited, mem
        if waited >= cfg.release_timeout_s:
            return False, waited, mem
        if not logged:
            logged = True
            log.info("gate_waiting_for_gpu_memory", timeout_s=cfg.release_timeout_s,
                     busy=[d["device"] for d in mem if not d["released"]],
                     next="launching once the previous attempt's GPU memory is released")
        sleep(min(_RELEASE_POLL_S, max(cfg.release_timeout_s - waited, 0.0)))


def _release_reason(mem: list[dict[str, object]], cfg: GpuConfig, waited: float) -> str:
    busy = [d for d in mem if not d["released"]]
    parts = [f"{d['label']} at {float(d['fraction']):.1%}"  # type: ignore[arg-type]
             + (f" held by previous pids {d['previous_pids_holding']}" if d["previous_pids_holding"] else "")
             for d in busy]
    return (f"GPU memory not released after {waited:.1f} s (gpu.release_timeout_s = {cfg.release_timeout_s:g}, "
            f"threshold {cfg.release_threshold:.0%}): " + ", ".join(parts))


def _gate_broken(cfg: GpuConfig, exc: BaseException) -> GateVerdict:
    """The verdict when the GPU check itself failed (an NVML error nothing above expected): GPU
    health is unavailable for this launch, said as such; a failure only with ``gpu.require``."""
    msg = f"GPU check failed unexpectedly ({exc!r}): GPU health unavailable for this launch"
    log.warning("gpu_device_unknown", error=repr(exc), next="launching without GPU checks" if not cfg.require
                else "gpu.require = true: refusing the launch")
    if cfg.require:
        return GateVerdict(False, (msg + " (gpu.require = true)",), 0.0, {"gpu_unavailable": repr(exc)}, (),
                           True, (GateCheck.GPU_SIGHT,))
    return GateVerdict(True, (), 0.0, {"gpu_unavailable": repr(exc)}, (msg + "; launching without GPU checks",), True)


class LaunchGate:
    """Remembers what the first gate saw (device count, checkpoint mount) for the later ones.

    The runner calls :meth:`check` before every launch with the previous attempt's pids (empty
    before the first) and records ``verdict.to_dict()`` in the ledger; ``passed`` false -> give up.
    """

    def __init__(self, backend: GpuBackend, cfg: GpuConfig, *, checkpoint_dir: str | Path | None = None,
                 storage_probe: bool = True, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, env: Mapping[str, str] | None = None) -> None:
        self._backend, self._cfg = backend, cfg
        self._env = dict(env or {})  # the job's environment: its CUDA_VISIBLE_DEVICES
        self._ckpt = Path(checkpoint_dir) if checkpoint_dir and storage_probe else None
        self._clock, self._sleep = clock, sleep
        self._first_count: int | None = None
        self.baseline: StorageBaseline | None = None
        self.last: GateVerdict | None = None

    def check(self, previous_pids: Collection[int] = ()) -> GateVerdict:
        if self._ckpt is not None and self.baseline is None and self._ckpt.is_dir():
            self.baseline = StorageBaseline.record(self._ckpt)
        try:
            verdict = run_gate(self._backend, self._cfg, previous_pids, self._clock, sleep=self._sleep,
                               checkpoint_dir=self._ckpt, storage_baseline=self.baseline,
                               expected_devices=self._first_count, env=self._env)
        except Exception as exc:  # an NVML surprise is the GPU check's, never the checkpoint's
            verdict = _gate_broken(self._cfg, exc)
        count = verdict.details.get("device_count")
        if self._first_count is None and isinstance(count, int):
            self._first_count = count
        self.last = verdict
        if verdict.passed:
            log.info("gate_passed", summary=verdict.summary(), warnings=list(verdict.warnings),
                     waited_s=verdict.waited_s, next="launching the job")
        else:
            log.error("gate_failed", summary=verdict.summary(), reasons=list(verdict.reasons),
                      next="giving up: this node needs a human before another launch")
        return verdict
